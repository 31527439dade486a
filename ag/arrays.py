"""Where an array lives (NumPy on the host, CuPy on a GPU) and what a Tensor accepts as its value."""
from __future__ import annotations

import sys

import numpy as np


def array_module(x):
    """The module whose functions make arrays where ``x`` lives: numpy for host arrays, the
    array's own package (cupy for a ``cupy.ndarray``) for device arrays."""
    if isinstance(x, (np.ndarray, np.generic)) or not hasattr(x, "__array_function__"):
        return np
    return sys.modules.get(type(x).__module__.split(".")[0], np)


def as_array(x) -> np.ndarray:
    """x as an array, left where it lives (NumPy would refuse to copy a GPU array implicitly)."""
    return x if type(x) is np.ndarray or array_module(x) is not np else np.asarray(x)


def writeable(x) -> bool:
    """Whether ``x`` may be written into: NumPy's own flag. CuPy keeps no such flag (its
    ``flags`` has only the contiguity ones), so there a device array counts as writeable
    unless it is broadcast: a zero stride over an axis of more than one element would make
    one write land in several elements."""
    flag = getattr(x.flags, "writeable", None)
    if flag is not None:
        return flag
    return all(stride or n <= 1 for stride, n in zip(x.strides, x.shape))


def numeric_array(value, name: str | None) -> np.ndarray:
    """A Tensor's value: a numeric array (bool, int, float or complex), or a TypeError that says why not."""
    if hasattr(value, "value") and hasattr(value, "requires_grad"):
        raise TypeError(f"Tensor {name or ''}: value is already a Tensor; pass its .value")
    array = as_array(value)
    if array.dtype.kind not in "biufc" and not is_bfloat16(array.dtype):
        raise TypeError(f"Tensor {name or ''}: value must be numeric, got dtype {array.dtype} "
                        f"from {type(value).__name__}")
    return array


def is_bfloat16(dtype) -> bool:
    """ml_dtypes' bfloat16 (a NumPy "V" kind, so not caught by kind "f"): a float a Tensor may hold."""
    return dtype.name == "bfloat16"


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the axes that broadcasting added or stretched, back to ``shape``."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(
        extra + i for i, n in enumerate(shape) if n == 1 and grad.shape[extra + i] != 1)
    summed = np.empty_like(grad, shape=shape)
    # sum straight into a fresh buffer, so the result is nobody's view and can become a .grad
    np.sum(grad, axis=axes, keepdims=True, out=summed.reshape((1,) * extra + shape))
    return summed
