"""The lab's passes: the ops' large elementwise and row-wise passes shared among the lab's threads,
and a short vector's sum as one BLAS dot.

Each variant runs the classroom's own kernel (``ag.ops.kernels``) on blocks of elements or rows,
so it computes the same bits; a pass too small to share, or over arrays that are not C-contiguous
NumPy arrays of one shape, runs as the classroom's does.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..ops import fused
from . import subnormals, threads
from .seams import classroom_kernel


def shared_ufunc(ufunc: np.ufunc) -> Callable:
    """``ufunc(a, b, out=out)`` in blocks of elements when a, b and out are ``threads.shareable``
    (b may also be a number); a number 0 is passed as a 0-d array of a's dtype, made once."""
    def variant(a, b, out=None):
        b = _zero(a) if type(b) is int and b == 0 else b
        operands = (a,) if np.ndim(b) == 0 else (a, b)
        if not threads.shareable(*operands) or np.result_type(a, b) != a.dtype or \
                (out is not None and not threads.shareable(out, a)):
            return ufunc(a, b, out=out)
        out = np.empty_like(a) if out is None else out
        if len(operands) == 1:
            threads.elementwise(lambda o, x: ufunc(x, b, out=o), out, a)
        else:
            threads.elementwise(lambda o, x, y: ufunc(x, y, out=o), out, a, b)
        return out
    variant.__name__ = ufunc.__name__
    return variant


def _zero(x):
    """0 in the dtype of a NumPy float array, which the ufunc takes without converting a Python 0
    on every call; anything else (ints, GPU arrays) gets the Python 0."""
    return _ZEROS.get(x.dtype, 0) if type(x) is np.ndarray else 0


_ZEROS = {np.dtype(t): np.zeros((), t) for t in (np.float16, np.float32, np.float64, np.longdouble)}
for _z in _ZEROS.values():
    _z.flags.writeable = False
del _z


def in_row_blocks(name: str, arrays: tuple, *args, keep: int = 1) -> None:
    """The classroom kernel ``name`` on ``arrays`` (None stays None) and then ``args``, in blocks
    of rows (the last ``keep`` axes are a row, which reads only itself) on the lab's threads."""
    kernel = classroom_kernel(name)
    present = [a for a in arrays if a is not None]
    if not threads.shareable(*present) or present[0].ndim < keep:
        kernel(*arrays, *args)
        return
    row = present[0].shape[present[0].ndim - keep:]
    rows = [None if a is None else a.reshape((-1,) + row) for a in arrays]

    def block(start: int, stop: int) -> None:
        kernel(*(None if r is None else r[start:stop] for r in rows), *args)
    block.__name__ = name
    threads.in_blocks(block, len(next(r for r in rows if r is not None)), present[0].size, threads.MIN_PASS)


def gelu(y, x) -> None:
    in_row_blocks("gelu", (y, x), keep=0)


def gelu_grad(g, x) -> None:
    in_row_blocks("gelu_grad", (g, x), keep=0)


def layer_norm(x_hat, x, eps) -> None:
    in_row_blocks("layer_norm", (x_hat, x), eps)


def layer_norm_grad(x_hat, dx, dy, x, gamma, eps) -> None:
    in_row_blocks("layer_norm_grad", (x_hat, dx, dy, x), gamma, eps)


def scaled_masked_softmax(y, s, scale, causal) -> None:
    """A stack of (queries, keys) matrices, one matrix a row: the causal mask is a matrix's."""
    in_row_blocks("scaled_masked_softmax", (y, s), scale, causal, keep=2)


def softmax_grad(g, y, axis, scale=None) -> None:
    if axis != g.ndim - 1:
        classroom_kernel("softmax_grad")(g, y, axis, scale)
        return
    in_row_blocks("softmax_grad", (g, y), -1, scale)


def keep_mask(mask, seed, threshold) -> None:
    """The mask's chunks, each from its own generator, dealt to the lab's threads."""
    draw = classroom_kernel("keep_mask")
    chunks = -(-mask.size // fused.MASK_CHUNK)

    def chunks_of(first: int, stop: int) -> None:
        draw(mask, seed, threshold, first, stop)
    threads.in_blocks(chunks_of, chunks, mask.size, threads.MIN_PASS)


def dot_sum(x, axis=None, keepdims: bool = False):
    """Σ x over ``axis``. A float sum to one number is written into a 0-d array (``out=``), not
    made a scalar and then an array again; a float vector of up to ``DOT_SUM_MAX`` elements is
    summed as its dot product with ones, one BLAS call. That adds in another order than NumPy's
    pairwise sum, so the two may differ in the last bit; longer vectors keep the pairwise sum."""
    if type(x) is np.ndarray and not keepdims and len(axis) == x.ndim:
        ones = _ONES.get(x.dtype)  # float32 and float64, which BLAS adds
        if ones is not None and x.ndim == 1 and x.shape[0] <= DOT_SUM_MAX:
            out = np.empty((), x.dtype)
            x.dot(ones[x.shape[0]], out)  # returns a NumPy scalar; out is the 0-d array
            return out
        if x.dtype.kind in "fc":  # an int sum may widen its dtype, which out= would have to know
            return np.add.reduce(x, axis, None, np.empty((), x.dtype))
    return np.sum(x, axis=axis, keepdims=keepdims)


DOT_SUM_MAX = 64  # vectors up to this length are summed as x · 1


def _ones_views(dtype) -> tuple[np.ndarray, ...]:
    """Read-only vectors of 0 to DOT_SUM_MAX ones: views of one buffer, made at import."""
    ones = np.ones(DOT_SUM_MAX, dtype)
    ones.flags.writeable = False
    return tuple(ones[:n] for n in range(DOT_SUM_MAX + 1))


_ONES = {np.dtype(dtype): _ones_views(dtype) for dtype in (np.float32, np.float64)}


def variants() -> dict[str, Callable]:
    """The lab's kernels, by the seam each goes in."""
    return {"exp": subnormals.exp, "maximum": shared_ufunc(np.maximum), "multiply": shared_ufunc(np.multiply), "sum": dot_sum,
            "gelu": gelu, "gelu_grad": gelu_grad, "layer_norm": layer_norm, "layer_norm_grad": layer_norm_grad,
            "scaled_masked_softmax": scaled_masked_softmax, "softmax_grad": softmax_grad, "keep_mask": keep_mask}
