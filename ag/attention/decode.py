"""Decoding against a KV cache, FlashDecoding's way (Dao et al., 2023): the keys split in chunks,
one softmax a chunk, and the chunks merged by their logsumexps (lecture 4's online softmax again).

A decoding step has one query (or a few) against the whole cache, so each byte of K and V read
serves 2 · H/Hkv · Nq multiply-adds: the step is bound by bandwidth, not by arithmetic. A split over
keys lets many cores (a GPU's many blocks) read the cache at once; here it also bounds the scores
held at once to one split's.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..ops import ShapeError
from ..ops.kernels import KERNELS, classroom
from .flash import one_blas_thread
from .naive import check_value_shape
from .online import softmax_block
from .shapes import softmax_scale
from .variants import UNBOUNDED, Variants, variants

# Keys a split holds when ``num_splits`` is not given: its scores stay small beside the cache.
DEFAULT_SPLIT_KEYS = 1024


def flash_decode(q, k_cache, v_cache, *, cache_seqlens=None, num_splits: int | None = None, causal=False,
                 scale=None, window_size=(UNBOUNDED, UNBOUNDED), softcap: float = 0.0, alibi_slopes=None,
                 return_lse: bool = False):
    """O = softmax(scale · q Kᵀ) V for q (B, H, Nq, d) against the first ``cache_seqlens[b]`` keys of
    k_cache (B, Hkv, Ncache, d) and v_cache (B, Hkv, Ncache, dv), as FlashAttention's
    ``flash_attn_with_kvcache``: each entry's keys cut into ``num_splits`` chunks, each chunk's
    (o_s, lse_s) computed alone, then lse = log Σ_s e^lse_s and O = Σ_s e^(lse_s − lse) o_s.

    ``cache_seqlens``: (B,) integers, each at most Ncache (None: every slot is filled).
    ``num_splits``: chunks a row of keys is cut into (None: one for each ``DEFAULT_SPLIT_KEYS``).
    The diagonal, window, softcap and ALiBi are ``naive_attention``'s, with Nk = cache_seqlens[b].
    Arrays in, arrays out (inference: no autograd); with ``return_lse`` also lse (B, H, Nq).
    """
    q, k_cache, v_cache = (np.asarray(x) for x in (q, k_cache, v_cache))
    heads = check_value_shape("flash_decode", q, k_cache, v_cache)
    if len(heads.lead) != 1:
        raise ShapeError(f"flash_decode: q, k_cache and v_cache must be (batch, heads, tokens, head_dim), "
                         f"got shapes {q.shape}, {k_cache.shape} and {v_cache.shape}")
    seqlens = check_seqlens(cache_seqlens, heads.lead[0], heads.n_k)
    extra = variants("flash_decode", heads, causal, window_size, softcap, alibi_slopes)
    scale = softmax_scale(scale, heads.d)
    o = np.zeros(q.shape[:-1] + v_cache.shape[-1:], dtype=np.result_type(q, v_cache))
    lse = np.full(q.shape[:-1], -np.inf, dtype=o.dtype)

    def decode_one(b: int) -> None:
        n = seqlens[b]
        o[b], lse[b] = decode_entry(q[b], k_cache[b, :, :n], v_cache[b, :, :n], extra.for_entry((b,), n),
                                    scale, check_splits(num_splits, n))
    KERNELS.decode_entries(len(seqlens), int(seqlens.sum()) * heads.h * heads.n_q * heads.d, decode_one)
    return (o, lse) if return_lse else o


@classroom("decode_entries")
def each_entry(entries: int, work: int, decode_one: Callable[[int], None]) -> None:
    """``decode_one(b)`` for each of the ``entries`` batch entries in turn (``work``: the call's
    multiply-adds in q Kᵀ, for the lab's threads), BLAS held to one thread: a split's products are
    matrix-vector ones, and BLAS's threads would only wait on each other."""
    with one_blas_thread():
        for b in range(entries):
            decode_one(b)


def decode_entry(q, k, v, extra: Variants, scale: float, splits: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch entry: q (H, Nq, d) against its keys k (Hkv, n, d) and v (Hkv, n, dv): the keys its
    rows may see split in ``splits`` chunks, each a ``softmax_block``; returns O (H, Nq, dv) and lse (H, Nq)."""
    h_kv = k.shape[0]
    qg = q.reshape((h_kv, -1) + q.shape[1:]) * q.dtype.type(scale)  # (Hkv, G, Nq, d): a group shares K and V
    rows = np.arange(q.shape[1])
    lo, hi = extra.key_range(0, q.shape[1])  # a window reads only its own keys of the cache
    size = -(-(hi - lo) // splits) if hi > lo else 1
    o_parts, lse_parts = [], []
    for start in range(lo, hi, size):
        split = slice(start, min(start + size, hi))
        k_s, v_s = k[:, None, split], v[:, None, split]  # views of the cache: nothing copied
        s = extra.scores(np.matmul(qg, np.swapaxes(k_s, -1, -2)), rows, np.arange(split.start, split.stop), h_kv)
        part = softmax_block(s, v_s)
        o_parts.append(part.o)
        with np.errstate(divide="ignore"):
            lse_parts.append((part.m + np.log(part.l))[..., 0])
    o, lse = merge_splits(o_parts, lse_parts, qg.shape[:-1] + v.shape[-1:])
    return o.reshape(q.shape[:-1] + v.shape[-1:]), lse.reshape(q.shape[:-1])


def merge_splits(o_parts: list, lse_parts: list, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """FlashDecoding's combine: lse = log Σ_s e^lse_s, O = Σ_s e^(lse_s − lse) o_s; a row that saw no
    key in any split gets O = 0 and lse = −∞."""
    if not o_parts:
        return np.zeros(shape), np.full(shape[:-1], -np.inf)
    lse_s = np.stack(lse_parts)
    top = np.max(lse_s, axis=0)
    top = np.where(np.isfinite(top), top, 0)  # a row that saw nothing: every weight is 0
    weights = np.exp(lse_s - top)
    total = np.sum(weights, axis=0)
    with np.errstate(divide="ignore"):
        lse = top + np.log(total)
    o = np.zeros_like(o_parts[0])
    for w, part in zip(weights, o_parts):  # one split at a time: no stack of every split's O
        o += w[..., None] * part
    np.divide(o, total[..., None], out=o, where=total[..., None] != 0)
    return o, lse


def check_seqlens(cache_seqlens, batch: int, n_cache: int) -> np.ndarray:
    if cache_seqlens is None:
        return np.full(batch, n_cache, dtype=np.int64)
    seqlens = np.asarray(cache_seqlens)
    if seqlens.shape != (batch,) or seqlens.dtype.kind not in "iu" or (seqlens < 0).any() or (seqlens > n_cache).any():
        raise ValueError(f"flash_decode: cache_seqlens must be {batch} integers in [0, {n_cache}] (one a batch "
                         f"entry, at most the cache's length), got {cache_seqlens!r}")
    return seqlens.astype(np.int64)


def check_splits(num_splits, n: int) -> int:
    """The chunks a row of ``n`` keys is cut into: ``num_splits``, at most n (a split holds a key)."""
    if num_splits is None:
        return max(1, math.ceil(n / DEFAULT_SPLIT_KEYS))
    if isinstance(num_splits, bool) or not isinstance(num_splits, (int, np.integer)) or num_splits < 1:
        raise ValueError(f"flash_decode: num_splits must be a positive integer or None, got {num_splits!r}")
    return max(1, min(int(num_splits), n))
