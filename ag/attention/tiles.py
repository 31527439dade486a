"""One tiled call's shapes, mask, scale and tile sizes, and the tile arithmetic that the forward and
backward loops share: S_ij into one buffer, the causal mask as a cached tile, exp, row max and row sum."""
from __future__ import annotations

import math

import numpy as np

from .. import hooks
from ..modes import config
from .shapes import Heads
from .variants import Variants


class Tiles:
    """One call's shapes, mask, scale and tile sizes, and the tile arithmetic both loops share.

    Float32 tiles take S, dP, D and dS K in float64, rounded once: near a one-hot row dS = P ∘ (dP − D)
    is a difference of nearly equal terms, which a float32 product's rounding would swamp. They keep
    L in float64 too (``lse_dtype``)."""

    wide_products = True

    def __init__(self, heads: Heads, causal, scale: float, block_q: int, block_k: int,
                 offset: int | None = None, variants: Variants | None = None) -> None:
        self.heads, self.causal, self.scale, self.variants = heads, causal, scale, variants
        self.block_q, self.block_k = block_q, block_k
        # query i sees keys 0..i + offset
        if offset is None:
            offset = heads.n_k - heads.n_q if causal == "bottom_right" else 0
        self.offset = offset
        self._masks: dict[tuple, np.ndarray] = {}
        self._scores: np.ndarray | None = None  # S_ij's buffer, reused by every tile
        self._wides: dict[int, np.ndarray] = {}  # the wide products' operands and result
        self._tanh: np.ndarray | None = None  # softcap: the last tile's tanh(S / cap), for its slope
        self._keep: tuple = (None, None)  # dropout: the last tile's (where, Z / (1 - p))

    def grouped(self, x: np.ndarray, group: int) -> np.ndarray:
        """(..., H, N, d) viewed as (..., Hkv, group, N, d): query heads side by side with their k/v head."""
        return x.reshape(self.heads.lead + (x.shape[-3] // group, group) + x.shape[-2:])

    def key_tiles(self, q_start: int, q_stop: int):
        """The key tiles that rows q_start..q_stop-1 can see (causal: stop at the last visible key; a
        window: start at the first)."""
        if self.variants is not None:
            return range(*self.variants.key_range(q_start, q_stop), self.block_k)
        stop = self.heads.n_k
        if self.causal:
            stop = max(0, min(stop, q_stop + self.offset))
        return range(0, stop, self.block_k)

    def query_tiles(self, k_start: int):
        """The query tiles that can see some key from k_start on (causal: skip tiles above it; a
        window: and the tiles below its reach)."""
        if self.variants is not None:
            return self._query_tiles_of_window(k_start)
        start = 0
        if self.causal:
            first_row = max(0, k_start - self.offset)  # the first query row that sees key k_start
            start = first_row - first_row % self.block_q
        return range(start, self.heads.n_q, self.block_q)

    def _query_tiles_of_window(self, k_start: int):
        """Rows i see key j where i + offset - left <= j <= i + offset + right (a side of -1: unbounded)."""
        (left, right), offset = self.variants.window, self.variants.offset
        k_stop = min(k_start + self.block_k, self.heads.n_k)
        first = max(0, k_start - offset - right) if right >= 0 else 0
        last = min(self.heads.n_q - 1, k_stop - 1 - offset + left) if left >= 0 else self.heads.n_q - 1
        start = first - first % self.block_q
        return range(start, last + 1 if last >= first else start, self.block_q)

    def product_dtype(self, dtype) -> np.dtype:
        """The float a tile's products are taken in: float64 for float32 tiles where ``wide_products``,
        else their own."""
        dtype = np.dtype(dtype)
        return np.dtype(np.float64) if self.wide_products and dtype == np.float32 else dtype

    def lse_dtype(self, dtype) -> np.dtype:
        """The float L is kept in, ``product_dtype``: P = exp(S − L) carries L's rounding into every P of
        its row alike, which no sum in backward cancels."""
        return self.product_dtype(dtype)

    def product(self, a: np.ndarray, b: np.ndarray, out=None) -> np.ndarray:
        """a @ b, taken in ``product_dtype`` of b's dtype and rounded once to it (into ``out`` if given)."""
        dtype, wide = b.dtype, self.product_dtype(b.dtype)
        if wide == dtype and a.dtype == dtype:
            return np.matmul(a, b, out=out)
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        # the larger of a, b and a @ b, the lower its buffer: dS K then fits in dO Vᵀ's buffers
        sizes = (a.size, b.size, math.prod(shape))
        slot = {i: rank for rank, i in enumerate(sorted(range(3), key=lambda i: -sizes[i]))}
        exact = np.matmul(self._wide(slot[0], a), self._wide(slot[1], b), out=self._buffer(slot[2], shape, wide))
        if out is None:
            return exact.astype(dtype)
        np.copyto(out, exact)
        return out

    def _wide(self, slot: int, x: np.ndarray) -> np.ndarray:
        """x copied into buffer ``slot`` in ``product_dtype`` (x itself if already so)."""
        wide = self.product_dtype(x.dtype)
        if x.dtype == wide:
            return x
        buffer = self._buffer(slot, x.shape, wide)
        np.copyto(buffer, x)
        return buffer

    def _buffer(self, slot: int, shape: tuple[int, ...], dtype) -> np.ndarray:
        """Buffer ``slot`` of the wide products, reused as the score tile's is."""
        size = math.prod(shape)
        held = self._wides.get(slot)
        if held is None or held.size < size or held.dtype != dtype:
            held = self._wides[slot] = np.empty(size, dtype)
        return held[:size].reshape(shape)

    def row_dot(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """rowsum(a ∘ b) as (..., rows, 1), summed in ``product_dtype`` (D = rowsum(dO ∘ O))."""
        return np.einsum("...c,...c->...", a, b, dtype=self.product_dtype(a.dtype))[..., None]

    def scaled_queries(self, q: np.ndarray, rows: slice) -> np.ndarray:
        """scale · Q_i, in ``product_dtype``: folding the scale into the query tile saves a pass over
        every score tile."""
        return np.multiply(q[..., rows, :], self.scale, dtype=self.product_dtype(q.dtype))

    def scores(self, q_i, k_j, q_start: int, k_start: int) -> np.ndarray:
        """S_ij = (scale · Q_i) K_jᵀ in K_j's dtype, with masked entries set to -inf whatever they were
        (q_i comes scaled; a NaN in a key a row cannot see must not reach that row, as it would through
        + -inf). Every tile is written into the same buffer, as a GPU keeps S_ij in on-chip memory."""
        s = self.product(q_i, np.swapaxes(k_j, -1, -2),
                         out=self._score_tile(q_i.shape[:-1] + k_j.shape[-2:-1], k_j.dtype))
        if self.variants is not None:  # softcap, a window (the causal mask folded in) and ALiBi's bias
            rows, cols = np.arange(q_start, q_start + s.shape[-2]), np.arange(k_start, k_start + s.shape[-1])
            if self.variants.softcap:
                self._cap(s)
            np.copyto(s, self.variants.masked_and_biased(s, rows, cols, self.heads.h_kv))
            return s
        mask = self.mask(q_start, k_start, s.shape[-2], s.shape[-1], s.dtype)
        if mask is not None:
            np.fmin(s, mask, out=s)
        return s

    def _cap(self, s: np.ndarray) -> None:
        """S ← cap · tanh(S / cap) in S's buffer, FlashAttention's softcap, before the mask; the tanh
        is kept for ``softcap_grad``."""
        cap = s.dtype.type(self.variants.softcap)
        self._tanh = np.tanh(s / cap)
        np.multiply(self._tanh, cap, out=s)

    def softcap_grad(self, ds: np.ndarray) -> np.ndarray:
        """dS of the raw scores from dS of the capped ones, in place: dS ∘ (1 − tanh²(S / cap)), with
        the tanh that the tile's ``scores`` just took; ds as it is without softcap."""
        if self.variants is not None and self.variants.softcap:
            ds *= 1 - np.square(self._tanh)
        return ds

    def dropout(self, x: np.ndarray, q_start: int, k_start: int) -> np.ndarray:
        """x ∘ Z / (1 − p) for the tile at (q_start, k_start), Z its kept entries of P (``Variants.keep``:
        Philox of the seed, the head and the absolute row and column, so every tiling draws the same
        mask and none is stored); x itself without dropout. Backward uses a tile's mask twice: the
        last one is kept."""
        if self.variants is None or not self.variants.dropout_p:
            return x
        where = (q_start, k_start) + x.shape[-2:]
        if self._keep[0] != where:
            h = self.heads
            rows, cols = np.arange(q_start, q_start + x.shape[-2]), np.arange(k_start, k_start + x.shape[-1])
            bh = self.variants.counters(h).reshape(h.lead + (h.h_kv, h.group))
            self._keep = where, self.variants.keep(bh, rows, cols, x.dtype)
        return x * self._keep[1]

    def _score_tile(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        size = math.prod(shape)
        if self._scores is None or self._scores.size < size or self._scores.dtype != dtype:
            self._scores = np.empty(size, dtype)
        return self._scores[:size].reshape(shape)

    @staticmethod
    def exp(s: np.ndarray) -> np.ndarray:
        """P = e^S, in S's buffer."""
        return np.exp(s, out=s)

    @staticmethod
    def row_max(s: np.ndarray) -> np.ndarray:
        """rowmax(S) of a score tile, as (..., rows, 1)."""
        return np.max(s, axis=-1, keepdims=True)

    @staticmethod
    def row_sum(p: np.ndarray) -> np.ndarray:
        """rowsum(P) of a tile, as (..., rows, 1)."""
        return np.sum(p, axis=-1, keepdims=True)

    def free_buffers(self) -> None:
        """Free what the tiles keep between steps: the causal masks, the score buffer, softcap's tanh
        and dropout's mask."""
        self._masks.clear()
        self._wides.clear()
        self._scores = self._tanh = None
        self._keep = (None, None)

    def visited_keys(self, q_start: int, q_stop: int) -> list[slice]:
        """The key tiles the loops visit for rows q_start..q_stop-1, as slices."""
        return [slice(k, min(k + self.block_k, self.heads.n_k)) for k in self.key_tiles(q_start, q_stop)]

    def count_products(self, per_tile: int, keys=None) -> None:
        """Publish "product counted" (``count_ops`` subscribes) for ``per_tile`` (rows × d)·(d × cols)
        products on every visited tile of every query head: 2·rows·cols·d FLOPs each, as matmul
        counts one. ``keys``: the key slices visited for rows q_start..q_stop-1 (``visited_keys`` if
        None)."""
        if not config.watchers:  # the engine publishes only while something watches
            return
        h, keys = self.heads, keys or self.visited_keys
        area = 0
        for q0 in range(0, h.n_q, self.block_q):
            q1 = min(q0 + self.block_q, h.n_q)
            area += (q1 - q0) * sum(c.stop - c.start for c in keys(q0, q1))
        heads = math.prod(h.lead) * h.h
        for _ in range(per_tile):
            hooks.publish("product counted", 2 * area * h.d * heads)

    def masked(self, q_start: int, k_start: int, cols: int) -> bool:
        """Does the causal mask hide some of the ``cols`` keys from k_start on from some query of the
        tile from q_start? Its first query sees the fewest."""
        return bool(self.causal) and k_start + cols - 1 > q_start + self.offset

    def mask(self, q_start: int, k_start: int, rows: int, cols: int, dtype) -> np.ndarray | None:
        """The causal mask of one tile as a (rows, cols) bound for ``np.fmin``: NaN where the query
        sees the key, -inf where it does not. fmin takes the operand that is not NaN, so fmin(s, NaN)
        is s (a NaN score stays NaN) and fmin(s, -inf) is -inf (a NaN score too). None when every
        query of the tile sees every key of it. Tiles on a diagonal share one (keyed by where the
        diagonal crosses the tile)."""
        if not self.masked(q_start, k_start, cols):
            return None
        key = (k_start - q_start - self.offset, rows, cols, np.dtype(dtype))
        if key not in self._masks:
            keys, queries = np.arange(k_start, k_start + cols), np.arange(q_start, q_start + rows)
            visible = keys[None, :] <= queries[:, None] + self.offset
            self._masks[key] = np.where(visible, np.nan, -np.inf).astype(dtype)
        return self._masks[key]


def statistics_dtype(dtype) -> np.dtype:
    """The float the loops keep their statistics and accumulators in: float32 for a narrower float
    (float16, bfloat16), as FlashAttention does, else the inputs' own."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def forward_outputs(q, k, v, lse_dtype=None) -> tuple[np.ndarray, np.ndarray]:
    """O, (..., H, Nq, dv) zeroed (a row that sees no key stays 0), and L = -inf in ``lse_dtype`` (None:
    O's), for ``tiled_forward`` to fill. O keeps Q's memory order: Q a view of (s, b, heads, d) makes
    O one too."""
    dtype = np.result_type(q, k, v)
    return (np.zeros_like(q, dtype=dtype, shape=q.shape[:-1] + v.shape[-1:]),
            np.full(q.shape[:-1], -np.inf, dtype=lse_dtype or dtype))


def group_sum(x: np.ndarray) -> np.ndarray:
    """Σ over the query heads of a group (axis -3); nothing to add when the group is one head."""
    return x if x.shape[-3] == 1 else np.sum(x, axis=-3, keepdims=True)
