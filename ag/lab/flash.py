"""The lab's ``flash_attention`` on NumPy, put into the seam ``flash_passes``: the fixed-shift forward
and the base-2 backward (``flash_loops``) over one call's runs, shared among the lab's threads
(``sharing``), with wider tiles in a forward without a mask; the variants on the threads (``flash_variants``)."""
from __future__ import annotations

import math

import numpy as np

from ..attention.backward import tiled_backward
from ..attention.forward import tiled_forward
from ..attention.shapes import Heads
from ..attention.tiles import forward_outputs
from ..attention.variants import Variants
from . import sharing
from .flash_loops import base2_backward, fixed_shift_forward
from .flash_tiles import LabTiles
from .flash_variants import variant_passes
from .threads import workers

DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 256
# A forward without a mask streams wider tiles: its row max and row sum run faster along longer
# rows, and it has no diagonal tile to half waste (docs/lab.md).
DEFAULT_BLOCK_Q_FORWARD_UNMASKED = 512
DEFAULT_BLOCK_K_FORWARD_UNMASKED = 512


def passes(heads: Heads, causal, scale: float, block_q: int | None, block_k: int | None,
           variants: Variants | None = None, fixed_shift: bool = False):
    """Forward and backward on NumPy: the paper's ``tiled_forward`` and ``tiled_backward`` on the lab's
    tiles (``LabTiles``) over one call's runs (some key/value heads each) on the lab's ``workers()``
    threads. ``fixed_shift``: ``fixed_shift_forward`` and ``base2_backward`` instead, faster and less
    exact (``fixed_shift_passes``). Any variant (``variants``) runs the classroom's loops and tiles on
    the threads (``variant_passes``): the classroom's bits."""
    if variants is not None:
        return variant_passes(heads, causal, scale, block_q, block_k, variants)
    forward_loop, backward_loop = (fixed_shift_forward, base2_backward) if fixed_shift else (tiled_forward, tiled_backward)
    tiles = LabTiles(heads, causal, scale, block_q or DEFAULT_BLOCK_Q, block_k or DEFAULT_BLOCK_K)
    forward_tiles = tiles
    if not causal and None in (block_q, block_k):
        forward_tiles = LabTiles(heads, causal, scale, block_q or DEFAULT_BLOCK_Q_FORWARD_UNMASKED,
                                 block_k or DEFAULT_BLOCK_K_FORWARD_UNMASKED)
    asked = sharing.count(workers())
    threads = sharing.threads_for(math.prod(heads.lead) * heads.h * heads.n_q * heads.n_k * heads.d, asked)
    g = heads.group

    def forward(q, k, v):
        o, lse = forward_outputs(q, k, v)  # each run fills its rows of O and L in place

        def run_loop(own: LabTiles, run: sharing.Run) -> None:
            forward_loop(own if run.rows is None else own.for_rows(*run.rows), run.part(q, g, queries=True),
                         run.part(k), run.part(v),
                         out=(run.part(o, g, queries=True), run.part(lse, g, axis=-2, queries=True)))
        runs, own = _shared_out(forward_tiles, o.dtype, threads, by_query_tile=True)
        for t in own:  # on the caller's thread, before the loops
            t.reserve_scores(o.dtype)
        _each_run(runs, own, run_loop, hold_blas=asked > 1)
        forward_tiles.count_products(2, keys=forward_tiles.key_slices if fixed_shift else None)  # S = QKᵀ, PV
        return o, lse

    def backward(q, k, v, o, lse, do):
        grads = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)  # each run adds into its heads' share

        def run_loop(own: LabTiles, run: sharing.Run) -> None:
            backward_loop(own, run.part(q, g), run.part(k), run.part(v), run.part(o, g), run.part(lse, g, axis=-2),
                          run.part(do, g), grads=(run.part(grads[0], g), run.part(grads[1]), run.part(grads[2])))
        # each thread allocates its S buffer in its first loop, once D's temporary is gone
        _each_run(*_shared_out(tiles, q.dtype, threads), run_loop, hold_blas=asked > 1)
        tiles.count_products(5)  # S again, PᵀdO, dO Vᵀ, dS K, dSᵀ Q
        return grads
    return forward, backward


def fixed_shift_passes(heads: Heads, causal, scale: float, block_q: int | None, block_k: int | None,
                       variants: Variants | None = None):
    """``passes`` with the fixed shift and the base-2 backward, for ``seams.swap({"flash_passes":
    fixed_shift_passes})``: its e^S·v / e^S is not exactly v for a single key, and exp2's log2 e ·
    S rounds once more, so float32 lands up to 3 × torch's error where the paper's loop stays within 2 ×."""
    return passes(heads, causal, scale, block_q, block_k, variants, fixed_shift=True)


def _shared_out(tiles: LabTiles, dtype, threads: int, by_query_tile: bool = False) -> tuple[list, list[LabTiles]]:
    """The call's runs (``sharing``), and the tiles of each thread that takes them.
    ``by_query_tile`` (a forward): where the heads leave a thread idle, runs are cut by query tile."""
    runs = sharing.runs_of(tiles, dtype, threads, by_query_tile)
    return runs, [tiles.for_run(runs[0]) for _ in range(min(threads, len(runs)))]


def _each_run(runs: list, own: list[LabTiles], run_loop, hold_blas: bool) -> None:
    """Every run in turn on the threads, then every thread's buffers freed, on the caller's thread:
    nothing tile-sized stays alive between forward and backward.

    The forward's score buffers come from the caller's thread, whose malloc arena keeps its pages
    (a fresh thread's arena may have given them back). The forward holds O and L from its start, so a
    buffer allocated before it raises no peak; the backward's would sit beside D's temporary (dO ∘ O)."""
    try:
        sharing.in_turns(runs, own, run_loop, hold_blas)
    finally:
        for t in own:
            t.free_buffers()
