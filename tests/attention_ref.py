"""FlashAttention's test reference, ``attention_ref`` (Dao-AILab/flash-attention, tests/test_flash_attn.py),
written again for ag's layout (..., H, N, d): in torch, with its ``upcast`` and ``reorder_ops``, the
local (window) mask, softcap, ALiBi and a given dropout mask. Every test of a variant checks ag against it."""
from __future__ import annotations

import math

import numpy as np
import torch as t


def local_mask(n_q, n_k, window_size, offset):
    """True where query i may NOT see key j (FlashAttention's ``construct_local_mask``)."""
    row = t.arange(n_q)[:, None]
    col = t.arange(n_k)[None, :]
    left, right = window_size
    hidden = t.zeros(n_q, n_k, dtype=t.bool)
    if right >= 0:
        hidden |= col > row + offset + right
    if left >= 0:
        hidden |= col < row + offset - left
    return hidden


def attention_ref(q, k, v, *, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                  dropout_mask=None, dropout_p=0.0, scale=None, upcast=True, reorder_ops=False, wide=None):
    """O for torch tensors q (..., H, Nq, d), k (..., Hkv, Nk, d), v (..., Hkv, Nk, dv).

    ``upcast``: compute in ``wide`` (float64 unless given) and cast O back to q's dtype; else in
    q's own dtype, as PyTorch would (the error FlashAttention's tests allow twice of).
    ``reorder_ops``: scale k instead of q (the same math, another rounding)."""
    dtype = q.dtype
    if upcast:
        q, k, v = (x.to(wide or t.float64) for x in (q, k, v))
    group = q.shape[-3] // k.shape[-3]
    k, v = (x.repeat_interleave(group, dim=-3) for x in (k, v))
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    scores = q @ (k * scale).transpose(-1, -2) if reorder_ops else (q * scale) @ k.transpose(-1, -2)
    if softcap > 0:
        scores = t.tanh(scores / softcap) * softcap
    offset = 0 if causal in (True, "top_left") else n_k - n_q
    if causal:
        window_size = (window_size[0], 0)
    if window_size != (-1, -1):
        scores = scores.masked_fill(local_mask(n_q, n_k, window_size, offset), float("-inf"))
    if alibi_slopes is not None:
        slopes = t.as_tensor(np.asarray(alibi_slopes), dtype=scores.dtype)[..., None, None]
        distance = (t.arange(n_q)[:, None] + offset - t.arange(n_k)[None, :]).abs().to(scores.dtype)
        scores = scores - slopes * distance
    p = t.softmax(scores, dim=-1)
    p = t.nan_to_num(p, nan=0.0)  # a row that sees no key: ag's convention, O = 0
    if dropout_mask is not None:
        p = p.masked_fill(~t.as_tensor(dropout_mask), 0.0) / (1 - dropout_p)
    return (p @ v).to(dtype)
