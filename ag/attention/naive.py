"""Attention the standard way: S and P (N×N) materialized by ag ops, autograd through the engine."""
from __future__ import annotations

import numpy as np

from ..arrays import array_module
from ..ops import matmul, mul, reshape, softmax, transpose, where
from ..tensor import Tensor
from .shapes import check_causal, check_shapes, softmax_scale, visible_keys


def naive_attention(q, k, v, *, causal=False, scale=None):
    """O = softmax(scale · Q Kᵀ + mask) V, with S and P (N×N) materialized by ag ops.

    Arrays in, arrays out; Tensors in, a Tensor out whose backward runs through the engine.
    """
    check_causal("naive_attention", causal)
    tensors = any(isinstance(x, Tensor) for x in (q, k, v))
    q, k, v = (x if isinstance(x, Tensor) else Tensor(x) for x in (q, k, v))
    heads = check_shapes("naive_attention", q, k, v)
    g, lead = heads.group, heads.lead
    # (..., Hkv, G, N, d) for q against (..., Hkv, 1, N, d) for k and v: the group shares them
    qg = reshape(q, lead + (heads.h_kv, g, heads.n_q, heads.d))
    kg = reshape(k, lead + (heads.h_kv, 1, heads.n_k, heads.d))
    vg = reshape(v, lead + (heads.h_kv, 1, heads.n_k, heads.d))
    s = mul(matmul(qg, transpose(kg, _swap_last(kg.ndim))), softmax_scale(scale, heads.d))
    xp = array_module(q.value)  # the mask is made where the scores live (host or GPU)
    visible = visible_keys(causal, xp.arange(heads.n_q), xp.arange(heads.n_k), heads.n_q, heads.n_k)
    if visible is not None:
        s = where(np.broadcast_to(visible, s.shape), s, -np.inf)
    o = reshape(matmul(softmax(s, axis=-1), vg), q.shape)
    return o if tensors else o.value


def _swap_last(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)
