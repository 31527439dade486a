"""The shape ops: reshape, transpose, getitem and concat, and where, which picks each element from a or b."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ShapeError
from ..tensor import Grads, Saved, Tensor, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from .operands import (broadcast as _broadcast, normalize_axes as _axes, normalize_axis as _axis,
                       operand as _operand, operands as _operands)


def reshape(a, *shape) -> Tensor:
    """out = a viewed with a new shape;  da = dout reshaped back."""
    a = _operand("reshape", a)
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    try:
        value = a.value.reshape(shape)
    except ValueError:
        raise ShapeError(f"reshape: cannot reshape a tensor of shape {a.shape} "
                         f"({a.size} elements) to {shape}") from None

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (out.grad.reshape(a.shape),)
    return make_output(value, "reshape", (a,), _backward, call=(reshape, a, shape))


def transpose(a, axes: Sequence[int] | None = None) -> Tensor:
    """out = a with its axes permuted (reversed by default);  da = dout with the inverse permutation."""
    a = _operand("transpose", a)
    perm = tuple(range(a.ndim))[::-1] if axes is None else tuple(axes)
    if len(perm) != a.ndim or (perm and _axes("transpose", perm, a.ndim) != tuple(range(a.ndim))):
        raise ShapeError(f"transpose: axes {axes!r} are not a permutation of the "
                         f"{a.ndim} axes of shape {a.shape}")
    perm = tuple(int(p) % a.ndim for p in perm)
    inverse = tuple(int(i) for i in np.argsort(perm))
    value = np.transpose(a.value, perm)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (np.transpose(out.grad, inverse),)
    return make_output(value, "transpose", (a,), _backward, call=(transpose, a, perm))


def getitem(a, index) -> Tensor:
    """out = a[index];  da = dout scattered back into zeros of a's shape (summed where repeated)."""
    a = _operand("getitem", a)
    index = _plain_index(index)
    try:
        value = a.value[index]
    except (IndexError, TypeError) as error:
        raise ShapeError(f"getitem: index {index!r} does not fit shape {a.shape}: {error}") from None

    def _backward(out: Tensor, saved: Saved) -> Grads:
        g = np.zeros_like(out.grad, shape=a.shape)
        if _is_basic(index):
            g[index] = out.grad
        else:
            np.add.at(g, index, out.grad)
        return (g,)
    return make_output(value, "getitem", (a,), _backward, call=(getitem, a, index))


def _plain_index(index):
    if isinstance(index, Tensor):
        return index.value
    if isinstance(index, tuple):
        return tuple(i.value if isinstance(i, Tensor) else i for i in index)
    return index


def _is_basic(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, (slice, int, np.integer)) for p in parts)


def concat(tensors: Sequence, axis: int = 0) -> Tensor:
    """out = [t1, t2, ...] joined along ``axis``;  dt_i = the slice of dout that t_i became."""
    tensors = [_operand("concat", t) for t in tensors]
    if not tensors:
        raise ShapeError("concat: needs at least one tensor")
    ax = _axis("concat", axis, tensors[0].ndim)
    try:
        value = np.concatenate([t.value for t in tensors], axis=ax)
    except ValueError:
        raise ShapeError(f"concat: shapes {[x.shape for x in tensors]} differ outside axis {ax}") from None
    ends = np.cumsum([t.shape[ax] for t in tensors])[:-1]

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return np.split(out.grad, ends, axis=ax)
    return make_output(value, "concat", tensors, _backward, call=(concat, tensors, ax))


def where(condition, a, b) -> Tensor:
    """out = a where condition else b;  da = dout where condition,  db = dout elsewhere."""
    cond = condition.value if isinstance(condition, Tensor) else condition
    if not (hasattr(cond, "shape") and getattr(cond, "dtype", None) == np.bool_):
        raise TypeError(f"where: condition must be a boolean array, got "
                        f"{getattr(cond, 'dtype', type(cond).__name__)}")
    a, b = _operands("where", a, b)
    _broadcast("where", cond.shape, a.shape, b.shape)
    value = np.where(cond, a.value, b.value)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        zero = out.grad.dtype.type(0)
        return (np.where(cond, out.grad, zero) if a.requires_grad else None,
                np.where(cond, zero, out.grad) if b.requires_grad else None)
    return make_output(value, "where", (a, b), _backward, call=(where, cond, a, b))
