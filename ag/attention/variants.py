"""The variants of attention's scores, under FlashAttention's names: a sliding window
(``window_size``), logit softcapping (``softcap``), ALiBi (``alibi_slopes``) and dropout
(``dropout_p`` with a ``seed``). Each is a function of absolute (row, col) indices, so the naive
path, a tile of the tiled loops and a split of decoding compute the same thing.

The order is FlashAttention's: S = scale · Q Kᵀ; S ← cap · tanh(S / cap); keys outside the causal
mask or the window ← −∞; S ← S − slope · |i + offset − j|; P = softmax(S); P ← P ∘ keep / (1 − p).

The diagonal that the window, the causal mask and ALiBi measure from: key j = i + offset, with
offset = 0 for ``causal=True`` ("top_left", SDPA's is_causal) and offset = Nk − Nq otherwise
("bottom_right", and FlashAttention's window and ALiBi, which are always aligned bottom right).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..ops import ShapeError
from .dropout import check_seed, dropout_scale, keep_mask, keep_threshold
from .shapes import Heads, check_causal

UNBOUNDED = -1  # a side of the window that reaches as far as the keys go (FlashAttention's -1)


@dataclass(frozen=True)
class Variants:
    """One call's variants, checked. ``window`` is (left, right) with −1 for unbounded, the causal
    mask folded in (right = 0); ``softcap`` 0 means none; ``slopes`` is (..., H) or None. A share of
    the call (``for_share``) has ``first_row``, the call's row that is its query 0, and ``bh``, its
    heads' dropout counters b · H + h (None: the call's own, ``bh_index``)."""

    n_q: int
    n_k: int
    offset: int
    window: tuple[int, int]
    softcap: float = 0.0
    slopes: np.ndarray | None = None
    dropout_p: float = 0.0
    seed: int = 0
    top_left: bool = False
    first_row: int = 0
    bh: np.ndarray | None = None

    def for_entry(self, index: tuple[int, ...], n_k: int) -> Variants:
        """These variants for batch entry ``index`` alone, which has ``n_k`` keys (a KV cache's
        length, a packed sequence's): its slopes, and its diagonal moved to its own last key."""
        slopes = self.slopes[index] if self.slopes is not None and self.slopes.ndim > 1 else self.slopes
        offset = 0 if self.top_left else n_k - self.n_q
        return replace(self, n_k=n_k, offset=offset, slopes=slopes)

    def for_share(self, heads: Heads, index: tuple[int, ...] | None, query_heads: slice, first_row: int,
                  n_q: int) -> Variants:
        """These variants for the ``n_q`` query rows from ``first_row`` on of query heads ``query_heads``
        of batch entry ``index`` (None: of every entry) of a call with ``heads``, as a call of their own
        (a thread's share, ``ag.lab.sharing``): those heads' slopes and dropout counters, the diagonal
        moved up by first_row, and dropout's rows counted from it, so the share computes the call's bits."""
        def share(x: np.ndarray) -> np.ndarray:  # (H,) or lead + (H,): the share's entry and heads
            return (x[index] if index is not None and x.ndim > 1 else x)[..., query_heads]
        slopes = None if self.slopes is None else share(self.slopes)
        return replace(self, n_q=n_q, offset=self.offset + first_row, slopes=slopes,
                       first_row=self.first_row + first_row, bh=share(self.counters(heads)))

    def counters(self, heads: Heads) -> np.ndarray:
        """Dropout's counter of each (batch entry, query head) of ``heads``: the share's ``bh``, or
        ``bh_index(heads)`` for a whole call."""
        return bh_index(heads) if self.bh is None else self.bh

    def visible(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray | None:
        """Bool (rows, cols): may query rows[i] see key cols[j]? None when every key is visible:
        j ≥ i + offset − left (left ≥ 0) and j ≤ i + offset + right (right ≥ 0)."""
        left, right = self.window
        if left < 0 and right < 0:
            return None
        diagonal = np.asarray(rows)[:, None] + self.offset
        cols = np.asarray(cols)[None, :]
        seen = np.ones((diagonal.shape[0], cols.shape[1]), dtype=bool)
        if left >= 0:
            seen &= cols >= diagonal - left
        if right >= 0:
            seen &= cols <= diagonal + right
        return seen

    def key_range(self, first_row: int, stop_row: int) -> tuple[int, int]:
        """The keys [lo, hi) that queries first_row..stop_row − 1 may see: outside it a window or the
        causal mask hides every key, so a loop over keys need not read them (linear work for a window)."""
        left, right = self.window
        lo = max(0, first_row + self.offset - left) if left >= 0 else 0
        hi = min(self.n_k, stop_row - 1 + self.offset + right + 1) if right >= 0 else self.n_k
        return lo, max(lo, hi)

    def bias(self, rows: np.ndarray, cols: np.ndarray, dtype) -> np.ndarray | None:
        """ALiBi's bias, −slope · |i + offset − j|, shape slopes.shape + (rows, cols); None without."""
        if self.slopes is None:
            return None
        distance = np.abs(np.asarray(rows)[:, None] + self.offset - np.asarray(cols)[None, :])
        return (-self.slopes[..., None, None] * distance).astype(dtype)

    def scores(self, s: np.ndarray, rows: np.ndarray, cols: np.ndarray, h_kv: int) -> np.ndarray:
        """Grouped scores S (..., Hkv, G, rows, cols) of queries ``rows`` against keys ``cols``,
        softcapped, masked and biased: a tile's or a split's share of ``naive``'s S."""
        if self.softcap:
            s = np.tanh(s / self.softcap) * s.dtype.type(self.softcap)
        return self.masked_and_biased(s, rows, cols, h_kv)

    def masked_and_biased(self, s: np.ndarray, rows: np.ndarray, cols: np.ndarray, h_kv: int) -> np.ndarray:
        """Grouped scores, already softcapped, with the window's (and causal) mask and ALiBi's bias."""
        visible = self.visible(rows, cols)
        if visible is not None:
            s = np.where(visible, s, s.dtype.type(-np.inf))
        bias = self.bias(rows, cols, s.dtype)
        if bias is not None:
            s = s + bias.reshape(bias.shape[:-3] + (h_kv, -1) + bias.shape[-2:])
        return s

    def keep(self, bh, rows: np.ndarray, cols: np.ndarray, dtype) -> np.ndarray | None:
        """Dropout's kept entries times 1 / (1 − p) (``dropout.keep_mask``) for query ``rows`` of this
        call or share (the call's rows from ``first_row``); None without dropout."""
        if self.dropout_p == 0:
            return None
        mask = keep_mask(self.seed, bh, np.asarray(rows) + self.first_row, cols, self.dropout_p)
        return mask * np.asarray(dropout_scale(self.dropout_p), dtype=dtype)


def variants(op: str, heads: Heads, causal=False, window_size=(UNBOUNDED, UNBOUNDED), softcap: float = 0.0,
             alibi_slopes=None, dropout_p: float = 0.0, seed: int | None = None) -> Variants:
    """The variants of a call with ``heads``, checked, with errors that name ``op``."""
    check_causal(op, causal)
    left, right = check_window(op, window_size)
    if causal:  # FlashAttention's rule: causal is a window that ends at the diagonal
        right = 0
    if not np.isfinite(softcap) or softcap < 0:
        raise ValueError(f"{op}: softcap must be a finite number >= 0 (0 means none), got {softcap!r}")
    keep_threshold(dropout_p)
    if dropout_p and seed is None:
        raise ValueError(f"{op}: dropout_p = {dropout_p} needs a seed (an integer), so that backward "
                         "draws the same mask again")
    top_left = causal in (True, "top_left")
    return Variants(heads.n_q, heads.n_k, 0 if top_left else heads.n_k - heads.n_q, (left, right), float(softcap),
                    check_slopes(op, alibi_slopes, heads), float(dropout_p), check_seed(seed or 0), top_left)


def check_window(op: str, window_size) -> tuple[int, int]:
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, (int, np.integer)) and not isinstance(w, bool) and w >= -1 for w in window_size)):
        raise ValueError(f"{op}: window_size must be (left, right), two integers >= -1 (-1: unbounded), "
                         f"got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def check_slopes(op: str, alibi_slopes, heads: Heads) -> np.ndarray | None:
    """ALiBi's slopes as FlashAttention takes them, (H,) or (batch, H), broadcast against q's (..., H)."""
    if alibi_slopes is None:
        return None
    slopes = np.asarray(alibi_slopes, dtype=np.float64)
    allowed = ((heads.h,), heads.lead + (heads.h,))
    if slopes.shape not in allowed:
        raise ShapeError(f"{op}: alibi_slopes must have shape {allowed[0]} or {allowed[1]} "
                         f"(one slope a query head), got {slopes.shape}")
    return slopes


def bh_index(heads: Heads) -> np.ndarray:
    """Each (batch entry, query head)'s number b · H + h, shape lead + (H,): dropout's counter."""
    entries = int(np.prod(heads.lead, dtype=np.int64))
    return np.arange(entries * heads.h, dtype=np.uint64).reshape(heads.lead + (heads.h,))
