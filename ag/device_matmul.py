"""The matrix product of GPU arrays (CuPy), with as few copies of its operands as CuPy allows.

CuPy's matmul first copies each operand of a stack that is not C-contiguous
(cupy/_core/_routines_linalg.pyx), so a backward's transposed operand would be copied whole
(attention's Pᵀ in dV = Pᵀ dO). (yᵀ xᵀ)ᵀ is the same product with the other operands' copies and
one of the result (to C order); whichever way copies fewer bytes runs. ``ops.matmul`` calls it for
every array that is not NumPy's.
"""
from __future__ import annotations

import math

import numpy as np


def device_product(x, y):
    """x @ y for CuPy arrays (np.matmul dispatches to CuPy), copying the fewest bytes."""
    if min(x.ndim, y.ndim) < 2 or max(x.ndim, y.ndim) <= 2:
        return np.matmul(x, y)
    xt, yt = np.swapaxes(x, -1, -2), np.swapaxes(y, -1, -2)
    result = math.prod(np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (x.shape[-2], y.shape[-1]))
    if _copied(yt, xt) + result * np.result_type(x.dtype, y.dtype).itemsize < _copied(x, y):
        return np.swapaxes(np.matmul(yt, xt), -1, -2).copy()  # .copy() is C order, in NumPy and CuPy
    return np.matmul(x, y)


def _copied(*arrays) -> int:
    """Bytes CuPy's matmul copies of these operands of a stack: those that are not C-contiguous."""
    return sum(a.nbytes for a in arrays if not a.flags.c_contiguous)
