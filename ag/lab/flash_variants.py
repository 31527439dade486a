"""The variants of ``flash_attention`` (``ag.attention.variants``: a window, softcap, ALiBi, dropout, a
value head dim of its own) on the lab's threads: the classroom's loops on the classroom's tiles
(``Tiles``: float64 products for float32), over one call's runs (``sharing``), each run a call of its
own with the variants of its heads and rows (``Variants.for_share``). So the bits are the classroom's
for any number of workers, and the threads are the whole gain."""
from __future__ import annotations

import math

import numpy as np

from ..attention.backward import tiled_backward
from ..attention.flash import classroom_tiles
from ..attention.forward import tiled_forward
from ..attention.shapes import Heads
from ..attention.tiles import Tiles, forward_outputs
from ..attention.variants import Variants
from . import sharing
from .threads import workers


def variant_passes(heads: Heads, causal, scale: float, block_q: int | None, block_k: int | None,
                   variants: Variants):
    """``tiled_passes`` with the call cut into runs (some key/value heads each, a forward's also by
    query tile) on the lab's ``workers()`` threads, BLAS held to one thread as the classroom holds it."""
    forward_tiles, backward_tiles = classroom_tiles(heads, causal, scale, block_q, block_k, variants)
    threads = sharing.threads_for(math.prod(heads.lead) * heads.h * heads.n_q * heads.n_k * heads.d,
                                  sharing.count(workers()))
    g = heads.group

    def forward(q, k, v):
        o, lse = forward_outputs(q, k, v, forward_tiles.lse_dtype(np.result_type(q, k, v)))  # each run fills its rows

        def run_loop(run: sharing.Run) -> None:
            tiled_forward(run_tiles(forward_tiles, run), run.part(q, g, queries=True), run.part(k), run.part(v),
                          out=(run.part(o, g, queries=True), run.part(lse, g, axis=-2, queries=True)))
        sharing.on_threads(sharing.runs_of(forward_tiles, q.dtype, threads, by_query_tile=True), threads, run_loop)
        forward_tiles.count_products(2)  # S = QKᵀ, PV
        return o, lse

    def backward(q, k, v, o, lse, do):
        grads = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)  # each run adds into its heads' share

        def run_loop(run: sharing.Run) -> None:
            tiled_backward(run_tiles(backward_tiles, run), run.part(q, g), run.part(k), run.part(v), run.part(o, g),
                           run.part(lse, g, axis=-2), run.part(do, g),
                           grads=(run.part(grads[0], g), run.part(grads[1]), run.part(grads[2])))
        sharing.on_threads(sharing.runs_of(backward_tiles, q.dtype, threads), threads, run_loop)
        backward_tiles.count_products(5)  # S again, PᵀdO, dO Vᵀ, dS K, dSᵀ Q
        return grads
    return forward, backward


def run_tiles(tiles: Tiles, run: sharing.Run) -> Tiles:
    """The call's tiles for ``run`` alone, as a call of its own: its heads, of one batch entry or of
    all, its query rows (row 0 is the call's row ``first``), and their variants (``Variants.for_share``)."""
    h, g = tiles.heads, tiles.heads.group
    first, stop = run.rows or (0, h.n_q)
    heads = Heads(h.lead if run.index is None else (), run.heads * g, run.heads, stop - first, h.n_k, h.d)
    variants = tiles.variants.for_share(h, run.index, slice(run.first * g, run.stop * g), first, stop - first)
    return Tiles(heads, tiles.causal, tiles.scale, tiles.block_q, tiles.block_k, offset=tiles.offset + first,
                 variants=variants)

