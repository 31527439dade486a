"""The reductions: sum, mean, max and logsumexp over axes, softmax and log_softmax along one."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from ..tensor import Grads, Saved, Tensor, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from .kernels import KERNELS, classroom
from .operands import expand as _expand, normalize_axes as _axes, normalize_axis as _axis, operand as _operand


def _exp_floor(t: type) -> np.floating:
    """ln(tiny) rounded down to t: e^x is a subnormal number below it."""
    x = t(math.log(np.finfo(t).tiny))
    return np.nextafter(x, t(-np.inf)) if x > math.log(np.finfo(t).tiny) else x


# e^x is a subnormal number below x = ln(tiny): -87.3 in float32, -708.4 in float64
EXP_FLOOR = {np.dtype(t): _exp_floor(t) for t in (np.float32, np.float64)}


def sum(a, axis=None, keepdims: bool = False) -> Tensor:
    """out = Σ_axis a;  da = dout broadcast back over the summed axes."""
    a = _operand("sum", a)
    axes = _axes("sum", axis, len(a.shape))
    value = KERNELS.sum(a.value, axis=axes, keepdims=keepdims)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (np.broadcast_to(_expand(out.grad, axes, keepdims), a.shape),)
    return make_output(value, "sum", (a,), _backward)


def mean(a, axis=None, keepdims: bool = False) -> Tensor:
    """out = Σ_axis a / n;  da = dout / n broadcast back over the reduced axes."""
    a = _operand("mean", a)
    axes = _axes("mean", axis, a.ndim)
    n = math.prod(a.shape[ax] for ax in axes)
    value = np.mean(a.value, axis=axes, keepdims=keepdims)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (np.broadcast_to(_expand(out.grad, axes, keepdims) / n, a.shape),)
    return make_output(value, "mean", (a,), _backward)


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
    return make_output(value, "max", (a,), _backward, saves=(a,), saves_output=True)


def logsumexp(a, axis=None, keepdims: bool = False) -> Tensor:
    """out = log Σ_axis exp(a), computed as m + log Σ exp(a - m);  da = dout * exp(a - out)."""
    a = _operand("logsumexp", a)
    axes = _axes("logsumexp", axis, a.ndim)
    value = _logsumexp(a.value, axes, keepdims)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        lse = _expand(saved[out], axes, keepdims)
        return (_expand(out.grad, axes, keepdims) * _exp_shifted(saved[a], lse),)
    return make_output(value, "logsumexp", (a,), _backward, saves=(a,), saves_output=True)


def finite_max(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Row max used as the shift; 0 where the whole row is -inf, so the shift never makes NaN."""
    m = np.max(x, axis=axes, keepdims=True)
    return np.where(np.isfinite(m), m, 0).astype(x.dtype, copy=False)


def exp_flushed(x, lowest=None, flush_masked: bool = True):
    """e^x in x's buffer, and 0 where x <= ``EXP_FLOOR``, where e^x would be a subnormal number
    (some CPUs compute those many times as slowly). Such an x is raised
    to the floor's next number and its result multiplied by 0, without a branch. ``lowest``, a
    lower bound on x's finite entries known beforehand, saves the min over x. With
    ``flush_masked=False`` an x holding -inf (a mask) is not flushed. A NaN stays NaN. Only NumPy's
    float32 and float64 arrays are flushed."""
    floor = EXP_FLOOR.get(x.dtype) if type(x) is np.ndarray else None
    if floor is None or not x.size:
        return np.exp(x, out=x)
    if lowest is None:
        lowest = np.fmin.reduce(x, axis=None)
    if not lowest <= floor or (lowest == -np.inf and not flush_masked):  # not: a NaN lowest is no flush
        return np.exp(x, out=x)
    keep = x > floor  # False for a NaN, whose product with 0 stays NaN
    np.maximum(x, np.nextafter(floor, x.dtype.type(0)), out=x)
    np.exp(x, out=x)
    x *= keep
    return x


def _logsumexp(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    m = finite_max(x, axes)
    with np.errstate(divide="ignore"):  # the sum holds e^0 = 1: a flushed term could not change it
        out = m + np.log(np.sum(exp_flushed(x - m, flush_masked=False), axis=axes, keepdims=True))
    return out if keepdims else np.squeeze(out, axes)


def _exp_shifted(x: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """exp(x - lse), taking -inf - (-inf) as -inf (a row with nothing in it gets probability 0)."""
    shifted = x - np.where(np.isfinite(lse), lse, 0).astype(x.dtype, copy=False)
    return exp_flushed(shifted, flush_masked=False) * np.isfinite(lse)


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
    exp_flushed(y, flush_masked=False)
    divide_by_row_sums(y, ax)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        g = saved.writable_grad()
        KERNELS.softmax_grad(g, saved[out], ax)
        return (g,)
    return make_output(y, "softmax", (a,), _backward, saves_output=True)


def log_softmax(a, axis: int = -1) -> Tensor:
    """y = a - logsumexp(a);  da = dy - softmax(a) * Σ_axis dy."""
    a = _operand("log_softmax", a)
    ax = _axis("log_softmax", axis, a.ndim)
    value = a.value - _logsumexp(a.value, (ax,), keepdims=True)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        p = exp_flushed(saved[out].copy(), flush_masked=False)
        return (out.grad - p * np.sum(out.grad, axis=ax, keepdims=True),)
    return make_output(value, "log_softmax", (a,), _backward, saves_output=True)
