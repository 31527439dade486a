"""``flash_attention``: the tiled forward and backward as one op, on NumPy (its runs shared among
threads) or on the GPU (CuPy and the CUDA kernels)."""
from __future__ import annotations

import math

import numpy as np

from ..arrays import array_module
from ..tensor import Grads, Saved, Tensor, make_output
from . import sharing
from .backward import base2_backward, tiled_backward
from .forward import fixed_shift_forward, tiled_forward
from .shapes import check_block, check_causal, check_shapes, softmax_scale
from .tiles import Tiles, forward_outputs

DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 256
# Without a mask the forward streams wider key tiles: its row max and row sum run faster along
# rows of 512 than of 256, and it has no diagonal tile to half waste (BENCHMARKS.md, "History").
DEFAULT_BLOCK_K_FORWARD_UNMASKED = 512
# and, with the fixed shift's single pass a tile, 512 query rows (BENCHMARKS.md, "History")
DEFAULT_BLOCK_Q_FORWARD_UNMASKED = 512
# The forward's shift of the scores before exp: "fixed" (0, checked, ``fixed_shift_forward``) or
# "running" (the paper's running max m_i, ``tiled_forward``).
SHIFTS = ("fixed", "running")


def flash_attention(q, k, v, *, causal=False, scale=None, block_q: int | None = None,
                    block_k: int | None = None, return_lse: bool = False, backend: str = "numpy",
                    workers: int | None = None, shift: str = "fixed"):
    """O = softmax(scale · Q Kᵀ + mask) V, tile by tile: no N×N array is ever held.

    Arrays in, arrays out; Tensors in, a Tensor out whose backward recomputes P tile by tile
    from the saved logsumexp (gradients for q, k and v; for GQA, k's and v's summed over each
    group). With ``return_lse=True`` also returns lse = logsumexp of each row of scaled
    scores, shape (..., H, Nq), as an array.

    Tiles (NumPy path) are ``block_q`` query rows by ``block_k`` keys. None means ``DEFAULT_BLOCK_Q``
    and ``DEFAULT_BLOCK_K`` (256 × 256), except in a forward without a causal mask, which streams
    ``DEFAULT_BLOCK_Q_FORWARD_UNMASKED`` × ``DEFAULT_BLOCK_K_FORWARD_UNMASKED`` (512 × 512) tiles. The
    results do not depend on the tiles beyond float rounding.

    ``workers`` (NumPy path): threads that share the call. The call is cut into runs of a few
    key/value heads (with their query groups), of all batch entries at once or of one, dealt to
    the threads in turn, each with BLAS held to one thread (threadpoolctl), so nothing
    oversubscribes (``ag.attention.sharing``). Where the heads are fewer than the workers (one
    head, multi-query attention), the forward's runs are cut by query tile too; the backward's
    are not, as every query tile adds into the same dK and dV. A call too small to repay
    starting threads runs on the caller's thread. None means the cores this process may run on
    (its CPU affinity: ``taskset`` or a job's cpuset count); without threadpoolctl
    (``pip install 'ag[fast]'``) it is 1, on the caller's thread with BLAS as it is. Runs are
    independent, so the result is bit-identical for any number of workers.

    ``shift`` (NumPy path): what the forward subtracts from the scores before exp. ``"running"`` is
    the paper's running row max m_i (``tiled_forward``: a max, a subtract and an exp pass over each
    tile), and the backward is the paper's too (``tiled_backward``): exercises 4 and 5's loops.
    ``"fixed"`` (the default) subtracts nothing, since softmax does not depend on the shift: one
    exp pass a tile (``fixed_shift_forward``; exp2 where the scores are known to be small), checked
    after each query tile, whose rows are redone with the running max where a score left exp's
    range. Its backward, which reads L and needs no shift, takes exp2 where the scores allow
    (``base2_backward``).

    A probability e^(S - shift) below the float's smallest normal number (1.2e-38 in float32) is
    taken as 0 (``Tiles.exp``): an Intel core computes a subnormal result 14 times as slowly.
    """
    check_causal("flash_attention", causal)
    if shift not in SHIFTS:
        raise ValueError(f"flash_attention: shift must be 'fixed' or 'running', got {shift!r}")
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if size is not None:
            check_block("flash_attention", name, size)
    tensors = any(isinstance(x, Tensor) for x in (q, k, v))
    tq, tk, tv = (x if isinstance(x, Tensor) else Tensor(x) for x in (q, k, v))
    if _backend(backend, tq) == "cupy":
        forward, backward = _cupy_passes(causal, scale)
    else:
        forward, backward = _numpy_passes(tq, tk, tv, causal, scale, block_q, block_k, workers, shift)
    o, lse = forward(tq.value, tk.value, tv.value)
    if not tensors:
        return (o, lse) if return_lse else o

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return backward(saved[tq], saved[tk], saved[tv], saved[out], lse, out.grad)
    out = make_output(o, "flash_attention", (tq, tk, tv), _backward, saves=(tq, tk, tv), saves_output=True)
    return (out, lse) if return_lse else out


def _numpy_passes(tq: Tensor, tk: Tensor, tv: Tensor, causal, scale, block_q: int | None, block_k: int | None,
                  workers: int | None = None, shift: str = "fixed"):
    """Forward and backward on NumPy: ``fixed_shift_forward`` and ``base2_backward`` (or, with
    ``shift="running"``, ``tiled_forward`` and ``tiled_backward``) over one call's tiles, run by run
    (some key/value heads each) on ``workers`` threads."""
    if any(array_module(t.value) is not np for t in (tq, tk, tv)):
        raise TypeError(f"flash_attention: backend='numpy' needs NumPy arrays, got "
                        f"{', '.join(sorted({type(t.value).__module__ for t in (tq, tk, tv)}))} arrays; use "
                        "backend='cupy' (or 'auto') for GPU arrays")
    heads = check_shapes("flash_attention", tq, tk, tv)
    tiles = Tiles(heads, causal, softmax_scale(scale, heads.d), block_q or DEFAULT_BLOCK_Q, block_k or DEFAULT_BLOCK_K)
    forward_tiles = tiles
    if not causal and None in (block_q, block_k):
        forward_tiles = Tiles(heads, causal, tiles.scale, block_q or DEFAULT_BLOCK_Q_FORWARD_UNMASKED,
                              block_k or DEFAULT_BLOCK_K_FORWARD_UNMASKED)
    asked = sharing.count(workers)
    threads = sharing.threads_for(math.prod(heads.lead) * heads.h * heads.n_q * heads.n_k * heads.d, asked)

    def forward(q, k, v):
        # each run writes its heads' rows of O and L in place: no joining copy
        o, lse = forward_outputs(q, k, v)
        loop = fixed_shift_forward if shift == "fixed" else tiled_forward

        def run_loop(own: Tiles, run: sharing.Run) -> None:
            g = heads.group
            loop(own if run.rows is None else own.for_rows(*run.rows), run.part(q, g, queries=True),
                 run.part(k), run.part(v), out=(run.part(o, g, queries=True), run.part(lse, g, axis=-2, queries=True)))
        runs, own = _shared_out(forward_tiles, o.dtype, threads, by_query_tile=True)
        for t in own:  # on the caller's thread, before the loops (``Tiles.reserve_scores``)
            t.reserve_scores(o.dtype)
        _each_run(runs, own, run_loop, hold_blas=asked > 1)
        forward_tiles.count_products(2, cut=shift == "fixed")  # S = QKᵀ, PV
        return o, lse

    def backward(q, k, v, o, lse, do):
        # each run adds into its heads' share of grads in the inputs' own shapes: no joining copy
        grads = np.zeros(q.shape, q.dtype), np.zeros(k.shape, k.dtype), np.zeros(v.shape, v.dtype)
        loop = base2_backward if shift == "fixed" else tiled_backward

        def run_loop(own: Tiles, run: sharing.Run) -> None:
            g = heads.group
            loop(own, run.part(q, g), run.part(k), run.part(v), run.part(o, g), run.part(lse, g, axis=-2),
                 run.part(do, g), grads=(run.part(grads[0], g), run.part(grads[1]), run.part(grads[2])))
        # each thread allocates its S buffer in its first loop, once D's temporary is gone
        _each_run(*_shared_out(tiles, q.dtype, threads), run_loop, hold_blas=asked > 1)
        tiles.count_products(5)  # S again, PᵀdO, dO Vᵀ, dS K, dSᵀ Q
        return grads
    return forward, backward


def _shared_out(tiles: Tiles, dtype, threads: int, by_query_tile: bool = False) -> tuple[list, list[Tiles]]:
    """The call's runs (``ag.attention.sharing``), and the tiles of each thread that takes them.
    ``by_query_tile`` (a forward): where the heads leave a thread idle, runs are cut by query tile."""
    h = tiles.heads
    head_bytes = h.group * min(tiles.block_q, h.n_q) * min(tiles.block_k, h.n_k) * np.dtype(dtype).itemsize
    query_tiles = [(a, min(a + tiles.block_q, h.n_q)) for a in range(0, h.n_q, tiles.block_q)] if by_query_tile else None
    runs = sharing.plan_runs(h.lead, h.h_kv, head_bytes, threads, query_tiles)
    return runs, [tiles.for_run(runs[0]) for _ in range(min(threads, len(runs)))]


def _each_run(runs: list, own: list[Tiles], run_loop, hold_blas: bool) -> None:
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


def _cupy_passes(causal, scale):
    """The same passes on the GPU: ``kernels/flash_fwd.cu`` and ``flash_bwd.cu`` through CuPy
    (``gpu``), float32, one thread block per (batch·head, query tile), no atomics in backward."""
    from . import gpu
    ready, reason = gpu.available()
    if not ready:
        raise RuntimeError(f"flash_attention(backend='cupy'): {reason}")

    def forward(q, k, v):
        return gpu.forward(q, k, v, causal=causal, scale=scale)

    def backward(q, k, v, o, lse, do):
        return gpu.backward(q, k, v, o, lse, do, causal=causal, scale=scale)
    return forward, backward


def _backend(backend: str, q: Tensor) -> str:
    if backend == "auto":
        return "cupy" if type(q.value).__module__.startswith("cupy") else "numpy"
    if backend not in ("numpy", "cupy"):
        raise ValueError(f"flash_attention: backend must be 'numpy', 'cupy' or 'auto', got {backend!r}")
    return backend
