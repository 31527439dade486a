"""The reductions: sum, mean, max and logsumexp over axes, softmax and log_softmax along one."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from ..handover import grad_to_overwrite
from ..tensor import Saved, Tensor, accumulate_grad, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from . import threads as _threads
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
    value = _sum(a.value, axes, keepdims)
    if keepdims or len(axes) < len(a.shape):
        def _backward(out: Tensor, saved: Saved) -> None:
            accumulate_grad(a, np.broadcast_to(_expand(out.grad, axes, keepdims), a.shape))
        return make_output(value, "sum", (a,), _backward)
    return make_output(value, "sum", (a,), _sum_all_backward)


def _sum_all_backward(out: Tensor, saved: Saved) -> None:
    """The backward of a sum to one number: dout spread over the input's shape. It needs nothing
    but the input, so every such sum shares this one function, not a closure made per call
    (0.1 µs of a 1.3 µs op on a tiny tensor)."""
    (a,) = out.inputs
    accumulate_grad(a, np.broadcast_to(out.grad, a.shape))


def _sum(x, axes: tuple[int, ...], keepdims: bool):
    """x summed over ``axes``. A float sum to one number is written into a 0-d array (``out=``),
    not made a scalar and then an array again. A float vector of up to ``_DOT_SUM_MAX`` elements
    is summed as its dot product with ones (one BLAS call, as attention's ``row_sum`` does): 0.32
    against 0.66 µs for np.add.reduce on 4 elements, half of what a sum costs on a tiny tensor. It
    adds in another order than NumPy's pairwise sum, so the two may differ in the last bit; longer
    vectors keep the pairwise sum, whose rounding error grows more slowly."""
    if type(x) is np.ndarray and not keepdims and len(axes) == x.ndim:
        dtype = x.dtype
        ones = _ONES.get(dtype)  # float32 and float64, which BLAS adds
        if ones is not None and len(axes) == 1:
            n = x.shape[0]
            if n <= _DOT_SUM_MAX:
                out = np.empty((), dtype)
                x.dot(ones[n], out)  # returns a NumPy scalar; out is the 0-d array
                return out
        if dtype.kind in "fc":  # an int sum may widen its dtype, which out= would have to know
            return np.add.reduce(x, axes, None, np.empty((), dtype))
    return x.sum(axis=axes, keepdims=keepdims)


_DOT_SUM_MAX = 64  # vectors up to this length are summed as x · 1


def _ones_views(dtype) -> tuple[np.ndarray, ...]:
    """Read-only vectors of 0 to _DOT_SUM_MAX ones: views of one buffer, made at import."""
    ones = np.ones(_DOT_SUM_MAX, dtype)
    ones.flags.writeable = False
    return tuple(ones[:n] for n in range(_DOT_SUM_MAX + 1))


_ONES = {np.dtype(dtype): _ones_views(dtype) for dtype in (np.float32, np.float64)}


def mean(a, axis=None, keepdims: bool = False) -> Tensor:
    """out = Σ_axis a / n;  da = dout / n broadcast back over the reduced axes."""
    a = _operand("mean", a)
    axes = _axes("mean", axis, a.ndim)
    n = math.prod(a.shape[ax] for ax in axes)
    value = np.mean(a.value, axis=axes, keepdims=keepdims)

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, np.broadcast_to(_expand(out.grad, axes, keepdims) / n, a.shape))
    return make_output(value, "mean", (a,), _backward)


def max(a, axis=None, keepdims: bool = False) -> Tensor:
    """out = max_axis a;  da = dout at the maxima (split evenly between ties), 0 elsewhere."""
    a = _operand("max", a)
    axes = _axes("max", axis, a.ndim)
    if a.size == 0:
        raise ShapeError(f"max: cannot take the max of an empty tensor of shape {a.shape}")
    value = np.max(a.value, axis=axes, keepdims=keepdims)

    def _backward(out: Tensor, saved: Saved) -> None:
        is_max = saved[a] == _expand(saved[out], axes, keepdims)
        share = _expand(out.grad, axes, keepdims) / np.sum(is_max, axis=axes, keepdims=True)
        accumulate_grad(a, np.where(is_max, share, 0).astype(a.dtype, copy=False))
    return make_output(value, "max", (a,), _backward, saves=(a,), saves_output=True)


def logsumexp(a, axis=None, keepdims: bool = False) -> Tensor:
    """out = log Σ_axis exp(a), computed as m + log Σ exp(a - m);  da = dout * exp(a - out)."""
    a = _operand("logsumexp", a)
    axes = _axes("logsumexp", axis, a.ndim)
    value = _logsumexp(a.value, axes, keepdims)

    def _backward(out: Tensor, saved: Saved) -> None:
        lse = _expand(saved[out], axes, keepdims)
        accumulate_grad(a, _expand(out.grad, axes, keepdims) * _exp_shifted(saved[a], lse))
    return make_output(value, "logsumexp", (a,), _backward, saves=(a,), saves_output=True)


def finite_max(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Row max used as the shift; 0 where the whole row is -inf, so the shift never makes NaN."""
    m = np.max(x, axis=axes, keepdims=True)
    return np.where(np.isfinite(m), m, 0).astype(x.dtype, copy=False)


def exp_flushed(x, lowest=None, flush_masked: bool = True):
    """e^x in x's buffer, and 0 where x <= ``EXP_FLOOR``, where e^x would be a subnormal number.
    An Intel Xeon computes a subnormal e^x 14 times as slowly (822 µs against 58 over a 2 x 256 x
    256 float32 tile), and the shifted scores of a peaked softmax give many; AMD's Zen 4 takes no
    such penalty (BENCHMARKS.md, "History"). Such an x is raised to the floor's next number, whose
    e^x is normal, and its result multiplied by 0: passes without a branch, where a masked write
    took 8 times an exp's time over scattered entries on Zen 4. Finding no such x costs one min
    over x; a lower bound on x's finite entries known beforehand, ``lowest``, saves it. With
    ``flush_masked=False`` an x holding -inf (a mask) is not flushed: telling its -inf from a finite x
    below the floor costs as much as the exp, and the flush as much again (a causal naive attention
    step took 8% longer). A NaN stays NaN. Only NumPy's float32 and float64 arrays are flushed: a
    GPU takes no such penalty."""
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


def softmax_grad(out: Tensor, y: np.ndarray, axis: int, scale=None) -> np.ndarray:
    """y ∘ (dy - Σ_axis dy ∘ y), times ``scale`` if given, in one buffer of y's size (dy's own when
    nothing reads it after). Along the last axis of a large tensor, in blocks of rows on ag's op
    threads: a row reads only itself."""
    dy = out.grad
    if axis == y.ndim - 1 and type(y) is np.ndarray and y.flags.c_contiguous and dy.flags.c_contiguous:
        g = grad_to_overwrite(out)  # dy itself, or a copy: each block reads its dy rows before it writes them
        n = y.shape[-1]
        dy2, y2, g2 = dy.reshape(-1, n), y.reshape(-1, n), g.reshape(-1, n)
        _threads.in_blocks(lambda a, b: _softmax_grad_rows(dy2[a:b], y2[a:b], g2[a:b], scale),
                           len(y2), y.size, _threads.MIN_PASS)
        return g
    dot = np.expand_dims(np.einsum("...i,...i->...", np.moveaxis(dy, axis, -1), np.moveaxis(y, axis, -1)), axis)
    g = grad_to_overwrite(out)
    _softmax_grad_from(g, dot, y, scale)
    return g


def _softmax_grad_rows(dy: np.ndarray, y: np.ndarray, g: np.ndarray, scale) -> None:
    """softmax_grad on rows (n, k); g may be dy."""
    _softmax_grad_from(g, np.einsum("ij,ij->i", dy, y)[:, None], y, scale)


def _softmax_grad_from(g: np.ndarray, dot: np.ndarray, y: np.ndarray, scale) -> None:
    """g = y ∘ (g - dot) (· scale), in g: g holds dy and dot = Σ dy ∘ y on entry."""
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

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, softmax_grad(out, saved[out], ax))
    return make_output(y, "softmax", (a,), _backward, saves_output=True)


def log_softmax(a, axis: int = -1) -> Tensor:
    """y = a - logsumexp(a);  da = dy - softmax(a) * Σ_axis dy."""
    a = _operand("log_softmax", a)
    ax = _axis("log_softmax", axis, a.ndim)
    value = a.value - _logsumexp(a.value, (ax,), keepdims=True)

    def _backward(out: Tensor, saved: Saved) -> None:
        p = exp_flushed(saved[out].copy(), flush_masked=False)
        accumulate_grad(a, out.grad - p * np.sum(out.grad, axis=ax, keepdims=True))
    return make_output(value, "log_softmax", (a,), _backward, saves_output=True)
