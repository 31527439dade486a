"""Attention the standard way: S and P (N×N) materialized by ag ops, autograd through the engine.
It is every other path's reference, its variants (``variants``) included."""
from __future__ import annotations

import numpy as np

from ..arrays import array_module
from ..ops import ShapeError, add, matmul, mul, reshape, softmax, tanh, transpose, where
from ..tensor import Tensor
from .shapes import check_shapes, softmax_scale
from .variants import UNBOUNDED, Variants, bh_index, variants


def naive_attention(q, k, v, *, causal=False, scale=None, window_size=(UNBOUNDED, UNBOUNDED),
                    softcap: float = 0.0, alibi_slopes=None, dropout_p: float = 0.0, seed: int | None = None):
    """O = dropout(softmax(bias + mask + cap · tanh(scale · Q Kᵀ / cap))) V, with S and P (N×N)
    materialized by ag ops (the variants' order and conventions: ``ag.attention.variants``).

    v may have its own head dim (dv ≠ d, as in MLA): O is then (..., H, Nq, dv).
    Arrays in, arrays out; Tensors in, a Tensor out whose backward runs through the engine.
    """
    tensors = any(isinstance(x, Tensor) for x in (q, k, v))
    q, k, v = (x if isinstance(x, Tensor) else Tensor(x) for x in (q, k, v))
    heads = check_value_shape("naive_attention", q, k, v)
    extra = variants("naive_attention", heads, causal, window_size, softcap, alibi_slopes, dropout_p, seed)
    g, lead = heads.group, heads.lead
    # (..., Hkv, G, N, d) for q against (..., Hkv, 1, N, d) for k and v: the group shares them
    qg = reshape(q, lead + (heads.h_kv, g, heads.n_q, heads.d))
    kg = reshape(k, lead + (heads.h_kv, 1, heads.n_k, heads.d))
    vg = reshape(v, lead + (heads.h_kv, 1, heads.n_k, v.shape[-1]))
    s = mul(matmul(qg, transpose(kg, _swap_last(kg.ndim))), softmax_scale(scale, heads.d))
    p = softmax(scores_with_variants(s, extra, heads, array_module(q.value)), axis=-1)
    keep = extra.keep(bh_index(heads), np.arange(heads.n_q), np.arange(heads.n_k), p.dtype)
    if keep is not None:
        p = mul(p, keep.reshape(p.shape))
    o = reshape(matmul(p, vg), q.shape[:-1] + v.shape[-1:])
    return o if tensors else o.value


def scores_with_variants(s: Tensor, extra: Variants, heads, xp=np) -> Tensor:
    """Grouped scores (..., Hkv, G, Nq, Nk) softcapped, masked and biased, as ag ops."""
    if extra.softcap:
        s = mul(tanh(mul(s, 1.0 / extra.softcap)), extra.softcap)
    rows, cols = np.arange(heads.n_q), np.arange(heads.n_k)
    visible = extra.visible(rows, cols)
    if visible is not None:  # the mask is made where the scores live (host or GPU)
        s = where(np.broadcast_to(xp.asarray(visible), s.shape), s, -np.inf)
    bias = extra.bias(rows, cols, s.dtype)
    if bias is not None:
        s = add(s, xp.asarray(bias.reshape(bias.shape[:-3] + (heads.h_kv, heads.group) + bias.shape[-2:])))
    return s


def check_value_shape(op: str, q, k, v):
    """``check_shapes`` for q and k, and v with k's shape but its own head dim."""
    heads = check_shapes(op, q, k, k)
    if v.ndim != k.ndim or v.shape[:-1] != k.shape[:-1]:
        raise ShapeError(f"{op}: v must have k's shape but for its head dim, (..., Hkv, Nk, dv) = "
                         f"{k.shape[:-1] + ('dv',)}, got {v.shape}")
    return heads


def _swap_last(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)
