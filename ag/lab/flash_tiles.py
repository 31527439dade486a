"""The lab's tile arithmetic for ``flash_attention``: exp2 where NumPy's is the fast one, scores known
to be bounded taken without a check, subnormal probabilities flushed to 0, row sums by BLAS, and the
tiles of a thread's run (``sharing``) or of some query rows."""
from __future__ import annotations

import math
import sys
from dataclasses import replace

import numpy as np

from ..attention.shapes import Heads
from ..attention.tiles import Tiles
from .subnormals import exp_flushed

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


class LabTiles(Tiles):
    """``Tiles`` with the lab's arithmetic: the same loops run on it unchanged."""

    wide_products = False  # speed first: float32 products stay float32 (FA3 rule: the classroom path)

    def __init__(self, heads: Heads, causal, scale: float, block_q: int, block_k: int,
                 offset: int | None = None) -> None:
        super().__init__(heads, causal, scale, block_q, block_k, offset)
        self._ones: np.ndarray | None = None  # row_sum's vector of ones

    def key_slices(self, q_start: int, q_stop: int):
        """The key tiles that rows q_start..q_stop-1 can see, as slices, the last one cut at the last
        key any of them sees: a causal mask's diagonal leaves no tile of keys that no row sees."""
        stop = self.key_tiles(q_start, q_stop).stop
        return [slice(k, min(k + self.block_k, stop)) for k in range(0, stop, self.block_k)]

    def reserve_scores(self, dtype) -> None:
        """Allocate S_ij's buffer now, at the size of a full tile, so that no step allocates it."""
        h = self.heads
        self._score_tile(h.lead + (h.h_kv, h.group, min(self.block_q, h.n_q), min(self.block_k, h.n_k)), dtype)

    @property
    def base2(self) -> bool:
        """Do bounded tiles take e^S as 2^(log2 e · S)? Where NumPy's exp2 is the fast one (``EXP2_FAST``)."""
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
        """P = e^S in place, 0 where e^S would be a subnormal number (``subnormals.exp_flushed``),
        which an Intel Xeon computes many times as slowly (docs/lab.md)."""
        return exp_flushed(s)

    @staticmethod
    def row_max(s: np.ndarray) -> np.ndarray:
        """rowmax(S) as (..., rows, 1) by ``np.fmax``, which skips NaN where ``np.max`` must carry it, and
        is faster for it; a NaN score still reaches O through exp."""
        return np.fmax.reduce(s, axis=-1, keepdims=True)

    def row_sum(self, p: np.ndarray) -> np.ndarray:
        """rowsum(P) as (..., rows, 1): P times a vector of ones, which BLAS reads at memory speed."""
        n = p.shape[-1]
        if self._ones is None or self._ones.size < n or self._ones.dtype != p.dtype:
            self._ones = np.ones(max(n, self.block_k), p.dtype)
        return np.matmul(p, self._ones[:n])[..., None]

    def free_buffers(self) -> None:
        super().free_buffers()
        self._ones = None

    def for_run(self, run) -> LabTiles:
        """The same call's tiles for a thread that takes runs like ``run`` (``sharing``) or smaller:
        its own S buffer and mask cache."""
        h = self.heads
        heads = Heads(h.lead if run.index is None else (), run.heads * h.group, run.heads, h.n_q, h.n_k, h.d)
        return LabTiles(heads, self.causal, self.scale, self.block_q, self.block_k)

    def for_rows(self, q_start: int, q_stop: int) -> LabTiles:
        """The tiles of query rows q_start..q_stop-1 alone, as a call of their own: their query 0 is
        row q_start, which sees as far as it did. They share this call's S buffer, masks and ones."""
        rows = LabTiles(replace(self.heads, n_q=q_stop - q_start), self.causal, self.scale, self.block_q,
                        self.block_k, offset=self.offset + q_start)
        rows._scores, rows._masks, rows._ones = self._scores, self._masks, self._ones
        return rows


def longest_row(x: np.ndarray) -> float:
    """max ‖x_j‖ over the rows of x: with ‖q_i‖, it bounds every score |q_i · k_j| (Cauchy-Schwarz)."""
    return math.sqrt(float(np.max(np.einsum("...j,...j->...", x, x), initial=0.0)))
