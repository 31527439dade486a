"""Attention: the standard way (S and P materialized) and FlashAttention's tiled way.

Shapes: ``q`` is (..., H, Nq, d); ``k`` and ``v`` are (..., Hkv, Nk, d) with H a multiple
of Hkv: each key/value head serves a group of H / Hkv query heads (GQA; Hkv = 1 is MQA,
Hkv = H is ordinary multi-head attention). ``scale`` defaults to 1/√d.

Causal masking (``causal=True``) is top-left aligned, as in
``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``: query i sees keys
0..i. ``causal="bottom_right"`` is FlashAttention-2's alignment: query i sees keys
0..i + Nk - Nq, so when Nq > Nk the first rows see nothing; such a fully masked row
gives output 0 and zero gradients, never NaN.

The tiled path follows FlashAttention-2 (Dao, 2023), Algorithm 1 and 2: query tiles
outside, key/value tiles inside, a running max ``m_i`` and sum ``l_i``, an unscaled
accumulator ``acc`` divided once at the end, and only O and the logsumexp ``lse`` saved
for backward, which recomputes every tile of P from ``lse`` with D = rowsum(dO ∘ O).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from . import attention_workers
from .arrays import array_module
from .modes import config
from .ops import ShapeError, matmul, mul, reshape, softmax, transpose, where
from .tensor import Saved, Tensor, accumulate_grad, make_output
from .trace import count_matmul

DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 256
# Without a mask the forward streams wider key tiles: its row max and row sum run faster along
# rows of 512 than of 256, and it has no diagonal tile to half waste (BENCHMARKS.md, "History").
DEFAULT_BLOCK_K_FORWARD_UNMASKED = 512
# and, with the fixed shift's single pass a tile, 512 query rows (BENCHMARKS.md, "History")
DEFAULT_BLOCK_Q_FORWARD_UNMASKED = 512
LOG2_E = 1.0 / math.log(2.0)
# NumPy's float exp2 keeps its fast path for |x| up to about 126: log2 e · 80 is 115.4
EXP2_SAFE = 80.0
# The forward's shift of the scores before exp: "fixed" (0, checked, ``fixed_shift_forward``) or
# "running" (the paper's running max m_i, ``tiled_forward``).
SHIFTS = ("fixed", "running")


# ---- shapes and masks ----

@dataclass(frozen=True)
class _Heads:
    """The shapes of one attention call, checked."""

    lead: tuple[int, ...]
    h: int
    h_kv: int
    n_q: int
    n_k: int
    d: int

    @property
    def group(self) -> int:
        return self.h // self.h_kv


def _check_shapes(op: str, q, k, v) -> _Heads:
    if q.ndim < 3 or k.ndim < 3 or v.ndim < 3:
        raise ShapeError(f"{op}: q, k and v need at least 3 dimensions (..., heads, tokens, head_dim), "
                         f"got shapes {q.shape}, {k.shape} and {v.shape}")
    if not (q.ndim == k.ndim == v.ndim):
        raise ShapeError(f"{op}: q, k and v must have the same rank, got shapes {q.shape}, {k.shape} "
                         f"and {v.shape}")
    if k.shape != v.shape:
        raise ShapeError(f"{op}: k and v must have the same shape, got {k.shape} and {v.shape}")
    if q.shape[:-3] != k.shape[:-3]:
        raise ShapeError(f"{op}: leading (batch) dimensions differ: q {q.shape} and k {k.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ShapeError(f"{op}: head dims differ: q has d = {q.shape[-1]}, k has d = {k.shape[-1]}")
    h, h_kv = q.shape[-3], k.shape[-3]
    if h_kv == 0 or h % h_kv:
        raise ShapeError(f"{op}: {h} query heads are not a multiple of {h_kv} key/value heads "
                         f"(shapes {q.shape} and {k.shape})")
    return _Heads(tuple(q.shape[:-3]), h, h_kv, q.shape[-2], k.shape[-2], q.shape[-1])


def _check_causal(op: str, causal) -> None:
    if causal not in (False, True, "top_left", "bottom_right"):
        raise ValueError(f"{op}: causal must be False, True ('top_left') or 'bottom_right', got {causal!r}")


def _visible(causal, rows: np.ndarray, cols: np.ndarray, n_q: int, n_k: int) -> np.ndarray | None:
    """Boolean (rows, cols) array: may query ``rows[i]`` see key ``cols[j]``? None when all can."""
    if not causal:
        return None
    offset = n_k - n_q if causal == "bottom_right" else 0
    return cols[None, :] <= rows[:, None] + offset


def _scale(scale, d: int) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


# ---- the standard way: S and P in memory, autograd through the engine ----

def naive_attention(q, k, v, *, causal=False, scale=None):
    """O = softmax(scale · Q Kᵀ + mask) V, with S and P (N×N) materialized by ag ops.

    Arrays in, arrays out; Tensors in, a Tensor out whose backward runs through the engine.
    """
    _check_causal("naive_attention", causal)
    tensors = any(isinstance(x, Tensor) for x in (q, k, v))
    q, k, v = (x if isinstance(x, Tensor) else Tensor(x) for x in (q, k, v))
    heads = _check_shapes("naive_attention", q, k, v)
    g, lead = heads.group, heads.lead
    # (..., Hkv, G, N, d) for q against (..., Hkv, 1, N, d) for k and v: the group shares them
    qg = reshape(q, lead + (heads.h_kv, g, heads.n_q, heads.d))
    kg = reshape(k, lead + (heads.h_kv, 1, heads.n_k, heads.d))
    vg = reshape(v, lead + (heads.h_kv, 1, heads.n_k, heads.d))
    s = mul(matmul(qg, transpose(kg, _swap_last(kg.ndim))), _scale(scale, heads.d))
    xp = array_module(q.value)  # the mask is made where the scores live (host or GPU)
    visible = _visible(causal, xp.arange(heads.n_q), xp.arange(heads.n_k), heads.n_q, heads.n_k)
    if visible is not None:
        s = where(np.broadcast_to(visible, s.shape), s, -np.inf)
    o = reshape(matmul(softmax(s, axis=-1), vg), q.shape)
    return o if tensors else o.value


def _swap_last(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


# ---- online softmax: the lecture's block merge ----

@dataclass(frozen=True)
class SoftmaxBlock:
    """softmax over some columns of S, applied to their rows of V: o = Σ_j p_j v_j with
    p = exp(s - m) / l, m the row max and l = Σ exp(s - m) the row's normalizer."""

    o: np.ndarray
    m: np.ndarray
    l: np.ndarray


def softmax_block(s: np.ndarray, v: np.ndarray) -> SoftmaxBlock:
    """One block's softmax(s) @ v, with its row max ``m`` and normalizer ``l`` kept for merging."""
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)  # a row with nothing visible: p = 0, l = 0
    p = np.exp(s - m)
    l = np.sum(p, axis=-1, keepdims=True)
    o = np.divide(p @ v, l, out=np.zeros(p.shape[:-1] + v.shape[-1:], dtype=np.result_type(p, v)),
                  where=l != 0)
    return SoftmaxBlock(o, m, l)


def merge_softmax_blocks(a: SoftmaxBlock, b: SoftmaxBlock) -> SoftmaxBlock:
    """Softmax over the columns of both blocks, from the two results alone.

    m = max(m_a, m_b); each block's normalizer is rescaled to the new max,
    l = e^(m_a - m) l_a + e^(m_b - m) l_b, and o = (e^(m_a - m) l_a o_a + e^(m_b - m) l_b o_b) / l:
    each block's output weighted by its share of the normalizer (n1/(n1+n2) in the lecture).
    """
    ### BEGIN SOLUTION
    m = np.maximum(a.m, b.m)
    la, lb = np.exp(a.m - m) * a.l, np.exp(b.m - m) * b.l
    l = la + lb
    o = np.divide(la * a.o + lb * b.o, l, out=np.zeros_like(a.o), where=l != 0)
    ### END SOLUTION
    return SoftmaxBlock(o, m, l)


def online_softmax(s: np.ndarray, v: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """softmax(s, axis=-1) @ v computed block by block over the columns of s, never holding
    a whole row of P; returns the output and the row logsumexp m + log l."""
    _check_block("online_softmax", "block_size", block_size)
    result = None
    for start in range(0, s.shape[-1], block_size):
        block = softmax_block(s[..., start:start + block_size], v[..., start:start + block_size, :])
        result = block if result is None else merge_softmax_blocks(result, block)
    with np.errstate(divide="ignore"):
        lse = (result.m + np.log(result.l))[..., 0]
    return result.o, lse


def _check_block(op: str, name: str, size) -> None:
    if not isinstance(size, (int, np.integer)) or size <= 0:
        raise ValueError(f"{op}: {name} must be a positive integer, got {size!r}")


# ---- the tiled way: FlashAttention-2 on NumPy ----

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
    oversubscribes (``ag.attention_workers``). A call too small to repay starting threads
    runs on the caller's thread. None means the machine's cores; without threadpoolctl
    (``pip install 'ag[fast]'``) it is 1, on the caller's thread with BLAS as it is. Runs are
    independent, so the result is bit-identical for any number of workers.

    ``shift`` (NumPy path, forward): what is subtracted from the scores before exp. ``"running"`` is
    the paper's running row max m_i (``tiled_forward``: a max, a subtract and an exp pass over each
    tile). ``"fixed"`` (the default) subtracts nothing, since softmax does not depend on the shift: one
    exp pass a tile (``fixed_shift_forward``; exp2 where the scores are known to be small), checked
    after each query tile, whose rows are redone with the running max where a score left exp's
    range. The backward needs no shift: it reads L.
    """
    _check_causal("flash_attention", causal)
    if shift not in SHIFTS:
        raise ValueError(f"flash_attention: shift must be 'fixed' or 'running', got {shift!r}")
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if size is not None:
            _check_block("flash_attention", name, size)
    tensors = any(isinstance(x, Tensor) for x in (q, k, v))
    tq, tk, tv = (x if isinstance(x, Tensor) else Tensor(x) for x in (q, k, v))
    if _backend(backend, tq) == "cupy":
        forward, backward = _cupy_passes(causal, scale)
    else:
        forward, backward = _numpy_passes(tq, tk, tv, causal, scale, block_q, block_k, workers, shift)
    o, lse = forward(tq.value, tk.value, tv.value)
    if not tensors:
        return (o, lse) if return_lse else o

    def _backward(out: Tensor, saved: Saved) -> None:
        dq, dk, dv = backward(saved[tq], saved[tk], saved[tv], saved[out], lse, out.grad)
        for t, g in ((tq, dq), (tk, dk), (tv, dv)):
            if t.requires_grad:
                accumulate_grad(t, g)
    out = make_output(o, "flash_attention", (tq, tk, tv), _backward, saves=(tq, tk, tv), saves_output=True)
    return (out, lse) if return_lse else out


def _numpy_passes(tq: Tensor, tk: Tensor, tv: Tensor, causal, scale, block_q: int | None, block_k: int | None,
                  workers: int | None = None, shift: str = "fixed"):
    """Forward and backward on NumPy: ``fixed_shift_forward`` (or ``tiled_forward``) and
    ``tiled_backward`` over one call's tiles, run by run (some key/value heads each) on ``workers``
    threads."""
    if any(array_module(t.value) is not np for t in (tq, tk, tv)):
        raise TypeError(f"flash_attention: backend='numpy' needs NumPy arrays, got "
                        f"{', '.join(sorted({type(t.value).__module__ for t in (tq, tk, tv)}))} arrays; use "
                        "backend='cupy' (or 'auto') for GPU arrays")
    heads = _check_shapes("flash_attention", tq, tk, tv)
    tiles = _Tiles(heads, causal, _scale(scale, heads.d), block_q or DEFAULT_BLOCK_Q, block_k or DEFAULT_BLOCK_K)
    forward_tiles = tiles
    if not causal and None in (block_q, block_k):
        forward_tiles = _Tiles(heads, causal, tiles.scale, block_q or DEFAULT_BLOCK_Q_FORWARD_UNMASKED,
                               block_k or DEFAULT_BLOCK_K_FORWARD_UNMASKED)
    asked = attention_workers.count(workers)
    threads = attention_workers.threads_for(math.prod(heads.lead) * heads.h * heads.n_q * heads.n_k * heads.d, asked)

    def forward(q, k, v):
        # each run writes its heads' rows of O and L in place: no joining copy
        o, lse = _forward_outputs(q, k, v)
        loop = fixed_shift_forward if shift == "fixed" else tiled_forward

        def run_loop(own: _Tiles, run: attention_workers.Run) -> None:
            loop(own, run.part(q, heads.group), run.part(k), run.part(v),
                 out=(run.part(o, heads.group), run.part(lse, heads.group, axis=-2)))
        runs, own = _shared_out(forward_tiles, o.dtype, threads)
        for t in own:  # on the caller's thread, before the loops (``_Tiles.reserve_scores``)
            t.reserve_scores(o.dtype)
        _each_run(runs, own, run_loop, hold_blas=asked > 1)
        forward_tiles.count_products(2, cut=shift == "fixed")  # S = QKᵀ, PV
        return o, lse

    def backward(q, k, v, o, lse, do):
        # each run adds into its heads' share of grads in the inputs' own shapes: no joining copy
        grads = np.zeros(q.shape, q.dtype), np.zeros(k.shape, k.dtype), np.zeros(v.shape, v.dtype)

        def run_loop(own: _Tiles, run: attention_workers.Run) -> None:
            g = heads.group
            tiled_backward(own, run.part(q, g), run.part(k), run.part(v), run.part(o, g),
                           run.part(lse, g, axis=-2), run.part(do, g),
                           grads=(run.part(grads[0], g), run.part(grads[1]), run.part(grads[2])))
        # each thread allocates its S buffer in its first loop, once D's temporary is gone
        _each_run(*_shared_out(tiles, q.dtype, threads), run_loop, hold_blas=asked > 1)
        tiles.count_products(5)  # S again, PᵀdO, dO Vᵀ, dS K, dSᵀ Q
        return grads
    return forward, backward


def _shared_out(tiles: _Tiles, dtype, threads: int) -> tuple[list, list[_Tiles]]:
    """The call's runs (``ag.attention_workers``), and the tiles of each thread that takes them."""
    h = tiles.heads
    head_bytes = h.group * min(tiles.block_q, h.n_q) * min(tiles.block_k, h.n_k) * np.dtype(dtype).itemsize
    runs = attention_workers.plan_runs(h.lead, h.h_kv, head_bytes, threads)
    return runs, [tiles.for_run(runs[0]) for _ in range(min(threads, len(runs)))]


def _each_run(runs: list, own: list[_Tiles], run_loop, hold_blas: bool) -> None:
    """Every run in turn on the threads, then every thread's buffers freed, on the caller's thread:
    nothing tile-sized stays alive between forward and backward.

    The forward's score buffers come from the caller's thread. One a fresh thread allocates comes
    from that thread's malloc arena, and an arena that had given its pages back made the call fault
    1,000 pages in again, 1 ms of a 15 ms forward at N = 1024, in 9 of 80 interleaved benchmark
    turns (none since; BENCHMARKS.md, "History"). The forward holds O and L from its start, so a
    buffer allocated before it raises no peak; the backward's would sit beside D's temporary (dO ∘ O)."""
    try:
        attention_workers.in_turns(runs, own, run_loop, hold_blas)
    finally:
        for t in own:
            t.free_buffers()


def _forward_outputs(q, k, v) -> tuple[np.ndarray, np.ndarray]:
    """O, zeroed (a row that sees no key stays 0), and L = -inf, for ``tiled_forward`` to fill.

    O keeps Q's memory order: Q a view of (s, b, heads, d) makes O one too, and (s, b, h) for free."""
    dtype = np.result_type(q, k, v)
    return np.zeros_like(q, dtype=dtype), np.full(q.shape[:-1], -np.inf, dtype=dtype)


def _cupy_passes(causal, scale):
    """The same passes on the GPU: ``ag/kernels/flash_fwd.cu`` and ``flash_bwd.cu`` through CuPy,
    float32, one thread block per (batch·head, query tile), no atomics in backward."""
    from . import attention_cupy
    ready, reason = attention_cupy.available()
    if not ready:
        raise RuntimeError(f"flash_attention(backend='cupy'): {reason}")

    def forward(q, k, v):
        return attention_cupy.forward(q, k, v, causal=causal, scale=scale)

    def backward(q, k, v, o, lse, do):
        return attention_cupy.backward(q, k, v, o, lse, do, causal=causal, scale=scale)
    return forward, backward


def _backend(backend: str, q: Tensor) -> str:
    if backend == "auto":
        return "cupy" if type(q.value).__module__.startswith("cupy") else "numpy"
    if backend not in ("numpy", "cupy"):
        raise ValueError(f"flash_attention: backend must be 'numpy', 'cupy' or 'auto', got {backend!r}")
    return backend


class _Tiles:
    """One call's shapes, mask, scale and tile sizes, and the tile arithmetic both loops share."""

    def __init__(self, heads: _Heads, causal, scale: float, block_q: int, block_k: int,
                 offset: int | None = None) -> None:
        self.heads, self.causal, self.scale = heads, causal, scale
        self.block_q, self.block_k = block_q, block_k
        # query i sees keys 0..i + offset
        if offset is None:
            offset = heads.n_k - heads.n_q if causal == "bottom_right" else 0
        self.offset = offset
        self._masks: dict[tuple, np.ndarray] = {}
        self._scores: np.ndarray | None = None  # S_ij's buffer, reused by every tile
        self._ones: np.ndarray | None = None  # row_sum's vector of ones

    def grouped(self, x: np.ndarray, group: int) -> np.ndarray:
        """(..., H, N, d) viewed as (..., Hkv, group, N, d): query heads side by side with their k/v head."""
        return x.reshape(self.heads.lead + (x.shape[-3] // group, group) + x.shape[-2:])

    def key_tiles(self, q_start: int, q_stop: int):
        """The key tiles that rows q_start..q_stop-1 can see (causal: stop at the last visible key)."""
        stop = self.heads.n_k
        if self.causal:
            stop = max(0, min(stop, q_stop + self.offset))
        return range(0, stop, self.block_k)

    def key_slices(self, q_start: int, q_stop: int):
        """The key tiles that rows q_start..q_stop-1 can see, as slices, the last one cut at the last
        key any of them sees: a causal mask's diagonal leaves no tile of keys that no row sees."""
        stop = self.key_tiles(q_start, q_stop).stop
        return [slice(k, min(k + self.block_k, stop)) for k in range(0, stop, self.block_k)]

    def query_tiles(self, k_start: int):
        """The query tiles that can see some key from k_start on (causal: skip tiles above it)."""
        start = 0
        if self.causal:
            first_row = max(0, k_start - self.offset)  # the first query row that sees key k_start
            start = first_row - first_row % self.block_q
        return range(start, self.heads.n_q, self.block_q)

    def scaled_queries(self, q: np.ndarray, rows: slice) -> np.ndarray:
        """scale · Q_i: folding the scale into the query tile saves a pass over every score tile."""
        return q[..., rows, :] * q.dtype.type(self.scale)

    def scores(self, q_i, k_j, q_start: int, k_start: int) -> np.ndarray:
        """S_ij = (scale · Q_i) K_jᵀ, with masked entries set to -inf whatever they were (q_i comes
        scaled; a NaN in a key a row cannot see must not reach that row, as it would through + -inf).

        Every tile is written into the same buffer, as a GPU keeps S_ij in on-chip memory: the
        next call overwrites it. A fresh tile-sized array each step cost a worker's forward 10% at
        N = 1024, in page faults (BENCHMARKS.md, "History")."""
        s = np.matmul(q_i, np.swapaxes(k_j, -1, -2),
                      out=self._score_tile(q_i.shape[:-1] + k_j.shape[-2:-1], np.result_type(q_i, k_j)))
        mask = self.mask(q_start, k_start, s.shape[-2], s.shape[-1], s.dtype)
        if mask is not None:
            np.fmin(s, mask, out=s)
        return s

    def reserve_scores(self, dtype) -> None:
        """Allocate S_ij's buffer now, at the size of a full tile, so that no step allocates it."""
        h = self.heads
        self._score_tile(h.lead + (h.h_kv, h.group, min(self.block_q, h.n_q), min(self.block_k, h.n_k)), dtype)

    def _score_tile(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        size = math.prod(shape)
        if self._scores is None or self._scores.size < size or self._scores.dtype != dtype:
            self._scores = np.empty(size, dtype)
        return self._scores[:size].reshape(shape)

    def base2_queries(self, q_i: np.ndarray, longest_key: float) -> np.ndarray | None:
        """log2 e · q_i, for ``exp_scores`` to take e^S as 2^(log2 e · S), when every score of this
        query tile is known to lie within ±``EXP2_SAFE`` (‖q_i‖ · max ‖k_j‖ bounds it); else None."""
        if _longest_row(q_i) * longest_key > EXP2_SAFE:
            return None
        return q_i * q_i.dtype.type(LOG2_E)

    def exp_scores(self, q_i: np.ndarray, q2_i: np.ndarray | None, k_j: np.ndarray, q_start: int,
                   k_start: int) -> np.ndarray:
        """P_ij = e^(S_ij), masked entries 0, in S_ij's buffer. NumPy's exp2 takes half exp's time,
        but far longer on an input beyond ±126 (an underflow, a masked -inf): it is used on a tile
        without a mask whose scores ``base2_queries`` bounded, exp on any other."""
        if q2_i is not None and not self.masked(q_start, k_start, k_j.shape[-2]):
            s = self.scores(q2_i, k_j, q_start, k_start)
            return np.exp2(s, out=s)
        s = self.scores(q_i, k_j, q_start, k_start)
        return np.exp(s, out=s)

    @staticmethod
    def row_max(s: np.ndarray) -> np.ndarray:
        """rowmax(S) of a score tile, as (..., rows, 1). ``np.fmax`` skips NaN where ``np.max`` must
        carry it, and that makes it 25% faster here; a NaN score still reaches O through exp."""
        return np.fmax.reduce(s, axis=-1, keepdims=True)

    def row_sum(self, p: np.ndarray) -> np.ndarray:
        """rowsum(P) of a tile, as (..., rows, 1): P times a vector of ones. BLAS reads the tile
        once at memory speed, where NumPy's pairwise sum along rows takes three times as long
        (BENCHMARKS.md, "History")."""
        n = p.shape[-1]
        if self._ones is None or self._ones.size < n or self._ones.dtype != p.dtype:
            self._ones = np.ones(max(n, self.block_k), p.dtype)
        return np.matmul(p, self._ones[:n])[..., None]

    def free_buffers(self) -> None:
        """Free what the tiles keep between steps: the causal masks and the score buffer."""
        self._masks.clear()
        self._scores = self._ones = None

    def for_run(self, run) -> _Tiles:
        """The same call's tiles for a thread that takes runs like ``run`` (``ag.attention_workers``)
        or smaller: its own S buffer and mask cache."""
        h = self.heads
        heads = _Heads(h.lead if run.index is None else (), run.heads * h.group, run.heads, h.n_q, h.n_k, h.d)
        return _Tiles(heads, self.causal, self.scale, self.block_q, self.block_k)

    def for_rows(self, q_start: int, q_stop: int) -> _Tiles:
        """The tiles of query rows q_start..q_stop-1 alone, as a call of their own: their query 0 is
        row q_start, which sees as far as it did. They share this call's S buffer."""
        rows = _Tiles(replace(self.heads, n_q=q_stop - q_start), self.causal, self.scale, self.block_q,
                      self.block_k, offset=self.offset + q_start)
        rows._scores = self._scores
        return rows

    def count_products(self, per_tile: int, cut: bool = False) -> None:
        """Tell ``count_ops`` about ``per_tile`` (rows × d)·(d × cols) products on every visited
        tile of every query head: 2·rows·cols·d FLOPs each, as ``_mm`` counts a matmul. ``cut``:
        the tiles are ``key_slices``, the last one cut at the diagonal."""
        h = self.heads
        area = 0
        for q0 in range(0, h.n_q, self.block_q):
            q1 = min(q0 + self.block_q, h.n_q)
            cols = self.key_slices(q0, q1) if cut else [slice(k0, min(k0 + self.block_k, h.n_k))
                                                        for k0 in self.key_tiles(q0, q1)]
            area += (q1 - q0) * sum(c.stop - c.start for c in cols)
        heads = math.prod(h.lead) * h.h
        for _ in range(per_tile):
            count_matmul(config.phase, 2 * area * h.d * heads)

    def masked(self, q_start: int, k_start: int, cols: int) -> bool:
        """Does the causal mask hide some of the ``cols`` keys from k_start on from some query of the
        tile from q_start? Its first query sees the fewest."""
        return bool(self.causal) and k_start + cols - 1 > q_start + self.offset

    def mask(self, q_start: int, k_start: int, rows: int, cols: int, dtype) -> np.ndarray | None:
        """The causal mask of one tile as a (rows, cols) bound for ``np.fmin``: NaN where the query
        sees the key, -inf where it does not. fmin takes the operand that is not NaN, so fmin(s, NaN)
        is s (a NaN score stays NaN) and fmin(s, -inf) is -inf (a NaN score too), at the cost of one
        add. None when every query of the tile sees every key of it. Tiles on a diagonal share one."""
        if not self.masked(q_start, k_start, cols):
            return None
        key = (k_start - q_start, rows, cols, np.dtype(dtype))
        if key not in self._masks:
            keys, queries = np.arange(k_start, k_start + cols), np.arange(q_start, q_start + rows)
            visible = keys[None, :] <= queries[:, None] + self.offset
            self._masks[key] = np.where(visible, np.nan, -np.inf).astype(dtype)
        return self._masks[key]


def _group_sum(x: np.ndarray) -> np.ndarray:
    """Σ over the query heads of a group (axis -3); nothing to add when the group is one head."""
    return x if x.shape[-3] == 1 else np.sum(x, axis=-3, keepdims=True)


def tiled_forward(tiles: _Tiles, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  out=None) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1: for each query tile, stream the key/value tiles through m_i, l_i and acc;
    return O and the row logsumexp L = m_i + log l_i. ``out`` gives (O, L) to fill, zeroed and
    -inf (a worker's views of the whole call's); else they are allocated here."""
    h = tiles.heads
    qg, kg, vg = tiles.grouped(q, h.group), tiles.grouped(k, 1), tiles.grouped(v, 1)
    o, lse = out or _forward_outputs(q, k, v)
    og, lse_g = tiles.grouped(o, h.group), tiles.grouped(lse[..., None], h.group)[..., 0]
    dtype = og.dtype
    for q_start in range(0, h.n_q, tiles.block_q):
        rows = slice(q_start, q_start + tiles.block_q)
        q_i = tiles.scaled_queries(qg, rows)
        ### BEGIN SOLUTION
        m_i = np.full(q_i.shape[:-1] + (1,), -np.inf, dtype=dtype)
        l_i = np.zeros_like(m_i)
        acc = np.zeros(q_i.shape, dtype=dtype)
        for k_start in tiles.key_tiles(q_start, q_start + q_i.shape[-2]):
            cols = slice(k_start, k_start + tiles.block_k)
            s = tiles.scores(q_i, kg[..., cols, :], q_start, k_start)
            m_new = np.maximum(m_i, tiles.row_max(s))
            shift = np.where(np.isfinite(m_new), m_new, 0)  # a row with nothing visible yet
            s -= shift
            p = np.exp(s, out=s)
            alpha = np.exp(m_i - shift)  # rescales what was summed under the old max
            l_i = alpha * l_i + tiles.row_sum(p)
            acc *= alpha
            acc += np.matmul(p, vg[..., cols, :])
            m_i = m_new
        np.divide(acc, l_i, out=og[..., rows, :], where=l_i != 0)  # 0: saw nothing; NaN stays NaN
        with np.errstate(divide="ignore"):
            lse_g[..., rows] = (m_i + np.log(l_i))[..., 0]
        ### END SOLUTION
    return o, lse


def fixed_shift_forward(tiles: _Tiles, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                        out=None) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1 with a fixed shift of 0 in place of the running max: softmax(S) = e^S / Σ e^S
    for any shift, and m_i is there only to keep e^(S - m_i) in range. While it is, each tile needs
    one pass, P = e^S (``_Tiles.exp_scores``: exp2 where the scores are bounded), where the running
    max needs three (max, subtract, exp); l_i and acc add up with no rescaling, and L = log l_i. A
    fixed shift checked after the fact is FlashDecoding++'s unified max value (Hong et al., 2023).

    After each query tile, every row's l_i must lie in [tiny · 2^62, max]: then no e^S overflowed,
    and the scores that underflowed (each below tiny) make less than 2^-30 of l_i for N < 2^32, under
    the float's own rounding. Else (a score too large, a row that sees no key or only scores too
    small, a NaN) the tile's rows are redone with the running max (``tiled_forward``), which gives
    0 for a row that sees nothing and carries a NaN.

    Not an exercise, but it solves exercise 4 another way: a student's copy of ag (``ag assign
    --release``) has ``tiled_forward`` in its place (``Exercise.withheld``)."""
    ### BEGIN SOLUTION
    h = tiles.heads
    qg, kg, vg = tiles.grouped(q, h.group), tiles.grouped(k, 1), tiles.grouped(v, 1)
    o, lse = out or _forward_outputs(q, k, v)
    og, lse_g = tiles.grouped(o, h.group), tiles.grouped(lse[..., None], h.group)[..., 0]
    dtype = og.dtype
    info = np.finfo(dtype)
    smallest, longest_key = np.ldexp(info.tiny, 62), _longest_row(kg)
    for q_start in range(0, h.n_q, tiles.block_q):
        rows = slice(q_start, q_start + tiles.block_q)
        q_i = tiles.scaled_queries(qg, rows)
        q2_i = tiles.base2_queries(q_i, longest_key)
        l_i = np.zeros(q_i.shape[:-1] + (1,), dtype=dtype)
        acc = np.zeros(q_i.shape, dtype=dtype)
        with np.errstate(over="ignore", invalid="ignore"):  # the check below catches both
            for cols in tiles.key_slices(q_start, q_start + q_i.shape[-2]):
                p = tiles.exp_scores(q_i, q2_i, kg[..., cols, :], q_start, cols.start)
                l_i += tiles.row_sum(p)
                acc += np.matmul(p, vg[..., cols, :])
        if np.all((l_i >= smallest) & (l_i <= info.max)) and np.isfinite(acc).all():
            np.divide(acc, l_i, out=og[..., rows, :])
            lse_g[..., rows] = np.log(l_i)[..., 0]
        else:
            stop = min(q_start + tiles.block_q, h.n_q)
            tiled_forward(tiles.for_rows(q_start, stop), q[..., rows, :], k, v,
                          out=(o[..., rows, :], lse[..., rows]))
    return o, lse
    ### END SOLUTION


def _longest_row(x: np.ndarray) -> float:
    """max ‖x_j‖ over the rows of x: with ‖q_i‖, it bounds every score |q_i · k_j| (Cauchy-Schwarz)."""
    return math.sqrt(float(np.max(np.einsum("...j,...j->...", x, x), initial=0.0)))


def tiled_backward(tiles: _Tiles, q, k, v, o, lse, do, grads=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Algorithm 2: for each key/value tile, recompute P_ij = exp(S_ij - L_i) for every query
    tile; dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - D) with D = rowsum(dO ∘ O), dQ += scale · dS K,
    dK += dSᵀ (scale · Q) (for GQA, dK and dV summed over the group). The grads are allocated
    in the inputs' own shapes, so they can become the inputs' ``.grad`` without a copy; or
    ``grads`` gives zeroed (dq, dk, dv) to add into (a worker's views of the whole call's)."""
    h = tiles.heads
    qg, kg, vg = tiles.grouped(q, h.group), tiles.grouped(k, 1), tiles.grouped(v, 1)
    dog, og = tiles.grouped(do, h.group), tiles.grouped(o, h.group)
    lse_g = lse.reshape(qg.shape[:-1] + (1,))
    lse_g = np.where(lse_g == -np.inf, np.inf, lse_g)  # a row that saw nothing: P = 0 (NaN stays NaN)
    dq, dk, dv = grads or (np.zeros(q.shape, q.dtype), np.zeros(k.shape, k.dtype), np.zeros(v.shape, v.dtype))
    dqg, dkg, dvg = tiles.grouped(dq, h.group), tiles.grouped(dk, 1), tiles.grouped(dv, 1)
    ### BEGIN SOLUTION
    d_row = np.sum(dog * og, axis=-1, keepdims=True)
    for k_start in range(0, h.n_k, tiles.block_k):
        cols = slice(k_start, k_start + tiles.block_k)
        k_j, v_j = kg[..., cols, :], vg[..., cols, :]
        for q_start in tiles.query_tiles(k_start):
            rows = slice(q_start, q_start + tiles.block_q)
            q_i, do_i = tiles.scaled_queries(qg, rows), dog[..., rows, :]
            s = tiles.scores(q_i, k_j, q_start, k_start)
            s -= lse_g[..., rows, :]
            p = np.exp(s, out=s)
            dvg[..., cols, :] += _group_sum(np.matmul(np.swapaxes(p, -1, -2), do_i))
            ds = np.matmul(do_i, np.swapaxes(v_j, -1, -2))
            ds -= d_row[..., rows, :]
            ds *= p
            dqg[..., rows, :] += np.matmul(ds, k_j)
            dkg[..., cols, :] += _group_sum(np.matmul(np.swapaxes(ds, -1, -2), q_i))
    ### END SOLUTION
    dq *= dq.dtype.type(tiles.scale)  # dQ = scale · Σ dS K, one pass at the end
    return dq, dk, dv
