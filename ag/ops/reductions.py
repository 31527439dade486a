"""The reductions: sum, mean, max and logsumexp over axes, softmax and log_softmax along one."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from ..tensor import Grads, Saved, Tensor, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from .kernels import KERNELS, classroom
from .operands import expand as _expand, normalize_axes as _axes, normalize_axis as _axis, operand as _operand


def sum(a, axis=None, keepdims: bool = False) -> Tensor:
    """out = Σ_axis a;  da = dout broadcast back over the summed axes."""
    a = _operand("sum", a)
    axes = _axes("sum", axis, len(a.shape))
    value = KERNELS.sum(a.value, axis=axes, keepdims=keepdims)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (np.broadcast_to(_expand(out.grad, axes, keepdims), a.shape),)
    return make_output(value, "sum", (a,), _backward, call=(sum, a, axis, keepdims))


def mean(a, axis=None, keepdims: bool = False) -> Tensor:
    """out = Σ_axis a / n;  da = dout / n broadcast back over the reduced axes."""
    a = _operand("mean", a)
    axes = _axes("mean", axis, a.ndim)
    n = math.prod(a.shape[ax] for ax in axes)
    value = np.mean(a.value, axis=axes, keepdims=keepdims)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (np.broadcast_to(_expand(out.grad, axes, keepdims) / n, a.shape),)
    return make_output(value, "mean", (a,), _backward, call=(mean, a, axis, keepdims))


def max(a, axis=None, keepdims: bool = False) -> Tensor:
    """out = max_axis a;  da = dout at the maxima (split evenly between ties), 0 elsewhere."""
    a = _operand("max", a)
    axes = _axes("max", axis, a.ndim)
    if a.size == 0:
        raise ShapeError(f"max: cannot take the max of an empty tensor of shape {a.shape}")
    value = np.max(a.value, axis=axes, keepdims=keepdims)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        is_max = saved[a] == _expand(saved[out], axes, keepdims)
        share = _expand(out.grad, axes, keepdims) / np.sum(is_max, axis=axes, keepdims=True)
        return (np.where(is_max, share, 0).astype(a.dtype, copy=False),)
    return make_output(value, "max", (a,), _backward, saves=(a,), saves_output=True, call=(max, a, axis, keepdims))


def logsumexp(a, axis=None, keepdims: bool = False) -> Tensor:
    """out = log Σ_axis exp(a), computed as m + log Σ exp(a - m);  da = dout * exp(a - out)."""
    a = _operand("logsumexp", a)
    axes = _axes("logsumexp", axis, a.ndim)
    value = _logsumexp(a.value, axes, keepdims)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        lse = _expand(saved[out], axes, keepdims)
        return (_expand(out.grad, axes, keepdims) * _exp_shifted(saved[a], lse),)
    return make_output(value, "logsumexp", (a,), _backward, saves=(a,), saves_output=True,
                       call=(logsumexp, a, axis, keepdims))


def finite_max(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Row max used as the shift; 0 where the whole row is -inf, so the shift never makes NaN."""
    m = np.max(x, axis=axes, keepdims=True)
    return np.where(np.isfinite(m), m, 0).astype(x.dtype, copy=False)


def _logsumexp(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    m = finite_max(x, axes)
    shifted = x - m
    with np.errstate(divide="ignore"):  # a row of -inf only sums to 0: its logsumexp is -inf
        out = m + np.log(np.sum(KERNELS.exp(shifted, out=shifted), axis=axes, keepdims=True))
    return out if keepdims else np.squeeze(out, axes)


def _exp_shifted(x: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """exp(x - lse), taking -inf - (-inf) as -inf (a row with nothing in it gets probability 0)."""
    shifted = x - np.where(np.isfinite(lse), lse, 0).astype(x.dtype, copy=False)
    return KERNELS.exp(shifted, out=shifted) * np.isfinite(lse)


@classroom("softmax_grad")
def softmax_grad(g: np.ndarray, y: np.ndarray, axis: int, scale=None) -> None:
    """g = y ∘ (dy - Σ_axis dy ∘ y), times ``scale`` if given, in g's buffer: g holds dy on entry."""
    dot = np.expand_dims(np.einsum("...i,...i->...", np.moveaxis(g, axis, -1), np.moveaxis(y, axis, -1)), axis)
    g -= dot
    g *= y
    if scale is not None:
        g *= g.dtype.type(scale)


def divide_by_row_sums(y: np.ndarray, axis: int) -> None:
    """y /= Σ_axis y, in place, for y = exp(...) >= 0. A row with every entry -inf (fully masked)
    sums to 0 and keeps its zeros, no 0/0; a row with a NaN sums to NaN and all of it becomes NaN,
    as in torch. The zero sums become 1 by copyto, not by a divide with where=: CuPy's ufuncs take
    no where=."""
    total = np.sum(y, axis=axis, keepdims=True)
    np.copyto(total, 1, where=total == 0)
    np.divide(y, total, out=y)


def softmax(a, axis: int = -1) -> Tensor:
    """y = exp(a - max) / Σ exp(a - max);  da = y * (dy - Σ_axis dy * y)."""
    a = _operand("softmax", a)
    ax = _axis("softmax", axis, a.ndim)
    y = a.value - finite_max(a.value, (ax,))
    KERNELS.exp(y, out=y)
    divide_by_row_sums(y, ax)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        g = saved.writable_grad()
        KERNELS.softmax_grad(g, saved[out], ax)
        return (g,)
    return make_output(y, "softmax", (a,), _backward, saves_output=True, call=(softmax, a, axis))


def log_softmax(a, axis: int = -1) -> Tensor:
    """y = a - logsumexp(a);  da = dy - softmax(a) * Σ_axis dy."""
    a = _operand("log_softmax", a)
    ax = _axis("log_softmax", axis, a.ndim)
    value = a.value - _logsumexp(a.value, (ax,), keepdims=True)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        p = KERNELS.exp(saved[out])
        return (out.grad - p * np.sum(out.grad, axis=ax, keepdims=True),)
    return make_output(value, "log_softmax", (a,), _backward, saves_output=True, call=(log_softmax, a, axis))
