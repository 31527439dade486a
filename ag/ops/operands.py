"""The helpers every op shares: turning arguments into Tensors and checking shapes and axes."""
from __future__ import annotations

import numpy as np

from ..arrays import array_module
from ..errors import ShapeError
from ..tensor import Tensor, rematerialize


def as_tensor(x, like: Tensor | None = None) -> Tensor:
    """Lift a Python number or array to a constant Tensor; a number takes ``like``'s dtype rules."""
    if isinstance(x, Tensor):
        return x
    if like is not None and isinstance(x, (int, float, bool)):
        xp = np if like.value is None else array_module(like.value)
        return Tensor(xp.asarray(x, dtype=np.result_type(like.dtype, x)))
    return Tensor(x)


def operand(op: str, x, like: Tensor | None = None) -> Tensor:
    if isinstance(x, Tensor):
        if x.value is None:
            x.value = rematerialize(x, op)  # beamed back for this op, discarded again after it
        return x
    if isinstance(x, (int, float, bool, np.ndarray, np.number, list, tuple)) or array_module(x) is not np:
        try:
            return as_tensor(x, like)
        except TypeError as error:
            raise TypeError(f"{op}: {error}") from None
    raise TypeError(f"{op}: operands must be Tensors, arrays or numbers, got {type(x).__name__}")


def operands(op: str, a, b) -> tuple[Tensor, Tensor]:
    a = operand(op, a, b if isinstance(b, Tensor) else None)
    return a, operand(op, b, a)


def broadcast(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    if shapes.count(shapes[0]) == len(shapes):  # the common case, without a generator
        return shapes[0]
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise ShapeError(f"{op}: shapes {' and '.join(map(str, shapes))} do not broadcast "
                         "(trailing dimensions must be equal or 1)") from None


def normalize_axes(op: str, axis, ndim: int) -> tuple[int, ...]:
    """Normalize ``axis`` (None, int or tuple) to sorted non-negative axes, or raise."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    for ax in axes:
        if not isinstance(ax, (int, np.integer)) or not -ndim <= ax < ndim:
            raise ShapeError(f"{op}: axis {ax!r} is out of range for a tensor with {ndim} dimensions")
    normalized = sorted({int(ax) % (ndim or 1) for ax in axes})
    if len(normalized) != len(axes):
        raise ShapeError(f"{op}: repeated axis in {axis!r}")
    return tuple(normalized)


def normalize_axis(op: str, axis: int, ndim: int) -> int:
    if not isinstance(axis, (int, np.integer)):
        raise ShapeError(f"{op}: axis must be one integer, got {axis!r}")
    return normalize_axes(op, axis, ndim)[0]


def expand(g: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """Put the reduced axes back as size-1 dimensions, so ``g`` broadcasts against the input."""
    return g if keepdims else np.expand_dims(g, axes)  # axes sorted: each lands where it was


def needs(a: Tensor, b: Tensor) -> tuple[Tensor, ...]:
    """For a product: a's gradient reads b's value and b's gradient reads a's."""
    return ((b,) if a.requires_grad else ()) + ((a,) if b.requires_grad else ())
