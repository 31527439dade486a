"""One tiled call's shapes, mask, scale and tile sizes, and the tile arithmetic that the forward and
backward loops share: S_ij into one buffer, the causal mask as a cached tile, exp or exp2, row sums."""
from __future__ import annotations

import math
import sys
from dataclasses import replace

import numpy as np

from ..modes import config
from ..ops.reductions import exp_flushed
from ..trace import count_matmul
from .shapes import Heads

LOG2_E = 1.0 / math.log(2.0)
LN_2 = math.log(2.0)
# NumPy's float exp2 keeps its fast path for |x| up to about 126: log2 e · 80 is 115.4
EXP2_SAFE = 80.0


def exp2_is_fast() -> bool:
    """Is NumPy's exp2 here its vector one, which takes half exp's time? It is SVML's, which NumPy
    builds for Linux on x86-64 and runs on a CPU with AVX-512 (Skylake-X's set: Intel Xeons, AMD
    Zen 4 and 5). Elsewhere exp2 runs an element at a time, slower than exp. Decided by the CPU,
    not by timing, so that a machine always takes the same path and gives the same bits."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # NumPy 1.x
        try:
            from numpy.core._multiarray_umath import __cpu_features__
        except ImportError:
            return False
    return sys.platform.startswith("linux") and bool(__cpu_features__.get("AVX512_SKX"))


# Where False, bounded tiles take exp (unchecked: no bounded score can give a subnormal), not exp2.
EXP2_FAST = exp2_is_fast()


class Tiles:
    """One call's shapes, mask, scale and tile sizes, and the tile arithmetic both loops share."""

    def __init__(self, heads: Heads, causal, scale: float, block_q: int, block_k: int,
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

    @property
    def base2(self) -> bool:
        """Do bounded tiles take e^S as 2^(log2 e · S)? Where NumPy's exp2 is the fast one
        (``EXP2_FAST``)."""
        return EXP2_FAST

    def bounded_queries(self, q_i: np.ndarray, longest_key: float) -> bool:
        """Does every score of this query tile lie within ±``EXP2_SAFE``? ‖q_i‖ · max ‖k_j‖ bounds it.
        If so and ``base2``, q_i (this tile's own copy of scale · Q_i) becomes log2 e · q_i in place,
        for ``exp_scores`` to take e^S as 2^(log2 e · S): no second copy, so the peak is the same
        whichever exp this CPU takes."""
        if longest_row(q_i) * longest_key > EXP2_SAFE:
            return False
        if self.base2:
            q_i *= q_i.dtype.type(LOG2_E)
        return True

    def exp_scores(self, q_i: np.ndarray, bounded: bool, k_j: np.ndarray, q_start: int,
                   k_start: int) -> np.ndarray:
        """P_ij = e^(S_ij), masked entries 0, in S_ij's buffer, from q_i as ``bounded_queries`` left
        it. A bounded tile takes exp2 where ``base2`` (its scores are in base 2) and it has no mask;
        exp2 is far slower on an input beyond ±126 (a masked -inf), so a masked one takes
        exp(ln 2 · S) there. Neither is checked for a subnormal result (no score is below -80); an
        unbounded tile takes ``exp`` and its flush."""
        s = self.scores(q_i, k_j, q_start, k_start)
        if not bounded:
            return self.exp(s)
        if self.base2 and not self.masked(q_start, k_start, k_j.shape[-2]):
            return np.exp2(s, out=s)
        if self.base2:
            s *= s.dtype.type(LN_2)
        return np.exp(s, out=s)

    def shift_bounded(self, qg: np.ndarray, kg: np.ndarray, lse_g: np.ndarray) -> list[bool]:
        """For each query tile of a backward: does every visible S_ij - L_i lie within -``EXP2_SAFE``
        and 0? S_ij ≥ -scale · ‖q_i‖ · max ‖k_j‖ (Cauchy-Schwarz) and L_i, the row's logsumexp, is at
        least its every score and at most the tile's largest L. A row that saw nothing (L = +inf
        here) or a NaN anywhere makes it False."""
        norms = np.sqrt(np.einsum("...j,...j->...", qg, qg))
        longest_key = longest_row(kg) * self.scale
        bounded = []
        for q_start in range(0, self.heads.n_q, self.block_q):
            rows = slice(q_start, q_start + self.block_q)
            lowest = (float(np.max(norms[..., rows], initial=0.0)) * longest_key
                      + float(np.max(lse_g[..., rows, :], initial=-np.inf)))
            bounded.append(lowest <= EXP2_SAFE)
        return bounded

    def exp_shifted_scores(self, q_i: np.ndarray, k_j: np.ndarray, lse_i: np.ndarray, q_start: int,
                           k_start: int, bounded: bool) -> np.ndarray:
        """P_ij = e^(S_ij - L_i), masked entries 0, in S_ij's buffer, from unscaled q_i and L_i. A
        tile that ``shift_bounded`` bounds takes 2^((log2 e · scale · Q_i) K_jᵀ - log2 e · L_i) where
        ``base2`` and it has no mask, else exp, neither checked for a subnormal result (none can
        come: e^-80 is normal); any other, ``exp`` and its flush. Either way the tile pair holds one
        scaled copy of q_i."""
        real = q_i.dtype.type
        if bounded and self.base2 and not self.masked(q_start, k_start, k_j.shape[-2]):
            s = self.scores(q_i * real(self.scale * LOG2_E), k_j, q_start, k_start)
            s -= lse_i * real(LOG2_E)
            return np.exp2(s, out=s)
        s = self.scores(self.scaled_queries(q_i, slice(None)), k_j, q_start, k_start)
        s -= lse_i
        return np.exp(s, out=s) if bounded else self.exp(s)

    @staticmethod
    def exp(s: np.ndarray) -> np.ndarray:
        """P = e^S in place, 0 where e^S would be a subnormal number (``ops.reductions.exp_flushed``),
        which an Intel Xeon computes 14 times as slowly: a step of peaked attention took 9 times as
        long there (BENCHMARKS.md, "History"). Finding no such score costs one min over the tile, an
        eighth of the exp."""
        return exp_flushed(s)

    @staticmethod
    def row_max(s: np.ndarray) -> np.ndarray:
        """rowmax(S) of a score tile, as (..., rows, 1). ``np.fmax`` skips NaN where ``np.max`` must
        carry it, which makes it faster; a NaN score still reaches O through exp."""
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

    def for_run(self, run) -> Tiles:
        """The same call's tiles for a thread that takes runs like ``run`` (``ag.attention.sharing``)
        or smaller: its own S buffer and mask cache."""
        h = self.heads
        heads = Heads(h.lead if run.index is None else (), run.heads * h.group, run.heads, h.n_q, h.n_k, h.d)
        return Tiles(heads, self.causal, self.scale, self.block_q, self.block_k)

    def for_rows(self, q_start: int, q_stop: int) -> Tiles:
        """The tiles of query rows q_start..q_stop-1 alone, as a call of their own: their query 0 is
        row q_start, which sees as far as it did. They share this call's S buffer, masks and ones."""
        rows = Tiles(replace(self.heads, n_q=q_stop - q_start), self.causal, self.scale, self.block_q,
                     self.block_k, offset=self.offset + q_start)
        rows._scores, rows._masks, rows._ones = self._scores, self._masks, self._ones
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
        add. None when every query of the tile sees every key of it. Tiles on a diagonal share one
        (of any ``for_rows``: the key is where the diagonal crosses the tile)."""
        if not self.masked(q_start, k_start, cols):
            return None
        key = (k_start - q_start - self.offset, rows, cols, np.dtype(dtype))
        if key not in self._masks:
            keys, queries = np.arange(k_start, k_start + cols), np.arange(q_start, q_start + rows)
            visible = keys[None, :] <= queries[:, None] + self.offset
            self._masks[key] = np.where(visible, np.nan, -np.inf).astype(dtype)
        return self._masks[key]


def forward_outputs(q, k, v) -> tuple[np.ndarray, np.ndarray]:
    """O, zeroed (a row that sees no key stays 0), and L = -inf, for ``tiled_forward`` to fill.

    O keeps Q's memory order: Q a view of (s, b, heads, d) makes O one too, and (s, b, h) for free."""
    dtype = np.result_type(q, k, v)
    return np.zeros_like(q, dtype=dtype), np.full(q.shape[:-1], -np.inf, dtype=dtype)


def group_sum(x: np.ndarray) -> np.ndarray:
    """Σ over the query heads of a group (axis -3); nothing to add when the group is one head."""
    return x if x.shape[-3] == 1 else np.sum(x, axis=-3, keepdims=True)


def longest_row(x: np.ndarray) -> float:
    """max ‖x_j‖ over the rows of x: with ‖q_i‖, it bounds every score |q_i · k_j| (Cauchy-Schwarz)."""
    return math.sqrt(float(np.max(np.einsum("...j,...j->...", x, x), initial=0.0)))
