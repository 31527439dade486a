"""The matrix product: matmul and linear (x @ w + b), each product counted by ``ag.count_ops``."""
from __future__ import annotations

import math

import numpy as np

from .. import trace
from ..errors import ShapeError
from ..modes import config
from ..tensor import Saved, Tensor, accumulate_grad, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from . import threads as _threads
from .operands import needs as _needs, operand as _operand, operands as _operands


def matmul(a, b) -> Tensor:
    """out = a @ b (leading dims broadcast);  da = dout @ b^T,  db = a^T @ dout."""
    a, b = _operands("matmul", a, b)
    _check_matmul(a, b)
    value = _mm(a.value, b.value)

    def _backward(out: Tensor, saved: Saved) -> None:
        g = out.grad
        if a.ndim == 1 or b.ndim == 1:  # as np.matmul does: a vector is a one-row or one-column matrix
            g = g.reshape(_matmul_shape(_as_matrix(a.shape, row=True), _as_matrix(b.shape, row=False)))
        if a.requires_grad:
            ga = _mm(g, np.swapaxes(_as_matrix(saved[b], row=False), -1, -2))
            accumulate_grad(a, ga[..., 0, :] if a.ndim == 1 else ga)
        if b.requires_grad:
            gb = _mm(np.swapaxes(_as_matrix(saved[a], row=True), -1, -2), g)
            accumulate_grad(b, gb[..., 0] if b.ndim == 1 else gb)
    return make_output(value, "matmul", (a, b), _backward, saves=_needs(a, b))


def _as_matrix(x, row: bool):
    """A 1-D array (or shape) as a one-row matrix (``row``) or a one-column one; else unchanged."""
    if isinstance(x, tuple):
        return x if len(x) != 1 else ((1,) + x if row else x + (1,))
    return x if x.ndim != 1 else (x[None, :] if row else x[:, None])


def linear(x, w, b=None) -> Tensor:
    """out = x @ w + b in one buffer (as torch's addmm);  dx = dout @ w^T,  dw = x^T @ dout,
    db = Σ dout over all but the last axis."""
    x, w = _operands("linear", x, w)
    if w.ndim != 2 or x.ndim < 1:
        raise ShapeError(f"linear: weight must be 2-D (in, out) and x at least 1-D, got shapes "
                         f"{x.shape} and {w.shape}")
    _check_matmul(x, w)
    if b is not None:
        b = _operand("linear", b, x)
        if b.shape != (w.shape[1],):
            raise ShapeError(f"linear: bias of shape {b.shape} does not match weight {w.shape}: "
                             f"expected ({w.shape[1]},)")
    # (s, b, h) as one (s·b, h) product: NumPy would run s products of b rows each
    value = _mm(x.value.reshape(-1, x.shape[-1]), w.value, x.shape[:-1] + (w.shape[1],))
    if b is not None:
        value += b.value

    def _backward(out: Tensor, saved: Saved) -> None:
        g = out.grad.reshape(-1, out.shape[-1])
        if x.requires_grad:
            accumulate_grad(x, _mm(g, saved[w].T, x.shape))
        if w.requires_grad:
            accumulate_grad(w, _mm(saved[x].reshape(-1, x.shape[-1]).T, g))
        if b is not None and b.requires_grad:
            accumulate_grad(b, g.sum(axis=0))
    inputs = (x, w) if b is None else (x, w, b)
    return make_output(value, "linear", inputs, _backward, saves=_needs(x, w))


def _mm(x: np.ndarray, y: np.ndarray, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """x @ y, counted by ``ag.count_ops`` as 2·m·n·k FLOPs in the current phase; with
    ``shape``, written into a fresh array of that shape (not a reshaped view of one). A large
    product is computed in steps of rows, columns or stacked matrices on ag's op threads
    (``_ProductBlocks``, ``threads``)."""
    blocks = _product_blocks(x, y)
    if blocks is not None:
        product = np.empty(shape or x.shape[:-1] + y.shape[-1:], np.result_type(x, y))  # C order, as matmul's
        _threads.in_blocks(blocks(product), len(blocks), blocks.multiply_adds, _threads.MIN_PRODUCT,
                           blas=True, align=blocks.align)
    elif shape is None and type(x) is not np.ndarray and min(x.ndim, y.ndim) >= 2 and max(x.ndim, y.ndim) > 2:
        product = _device_stack_product(x, y)
    elif shape is None:  # for 1-D and 2-D operands np.dot is np.matmul (to rounding) without 0.45 µs of set-up
        product = x.dot(y) if x.ndim <= 2 and y.ndim <= 2 else np.matmul(x, y)
    else:
        product = np.empty_like(x, shape=shape, dtype=np.result_type(x, y))
        np.matmul(x, y, out=product.reshape(x.shape[:-1] + y.shape[-1:]))
    if config.watchers:  # count_ops among them; 0.08 µs a product otherwise
        trace.count_matmul(config.phase, 2 * product.size * x.shape[-1])
    return product


def _device_stack_product(x, y):
    """x @ y for stacks of matrices off NumPy (CuPy). CuPy's matmul first copies each operand of a
    stack that is not C-contiguous (cupy/_core/_routines_linalg.pyx), so a backward's transposed
    operand would be copied whole: attention's Pᵀ in dV = Pᵀ dO, an N×N array NumPy's BLAS reads
    in place. (yᵀ xᵀ)ᵀ is the same product with the other operands' copies and one of the result
    (to C order); whichever way copies fewer bytes runs."""
    xt, yt = np.swapaxes(x, -1, -2), np.swapaxes(y, -1, -2)
    result = math.prod(np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (x.shape[-2], y.shape[-1]))
    if _copied(yt, xt) + result * np.result_type(x.dtype, y.dtype).itemsize < _copied(x, y):
        return np.swapaxes(np.matmul(yt, xt), -1, -2).copy()  # .copy() is C order, in NumPy and CuPy
    return np.matmul(x, y)


def _copied(*arrays) -> int:
    """Bytes CuPy's matmul copies of these operands of a stack: those that are not C-contiguous."""
    return sum(a.nbytes for a in arrays if not a.flags.c_contiguous)


class _ProductBlocks:
    """A product worth sharing among threads, as items to deal out: the matrices of a stack (any
    strides: no reshape copies), or the rows of a matrix product (its columns if it has few rows)
    in ``align`` steps, one BLAS call a step. A step's size depends on the shape alone, so the
    calls are the same for any number of threads: BLAS's kernels take rows and columns in groups
    whose sums may round differently at a block's edge, so the edges must not move with them."""

    def __init__(self, x: np.ndarray, y: np.ndarray, multiply_adds: int) -> None:
        self.x, self.y, self.multiply_adds = x, y, multiply_adds
        self.lead = x.shape[:-2]
        self.by_rows = bool(self.lead) or x.shape[0] >= 2 * _STEP_MIN
        steps = -(-len(self) // _STEPS)  # items a step, before rounding up to a multiple of _STEP_MIN
        self.align = 1 if self.lead else -(-steps // _STEP_MIN) * _STEP_MIN

    def __len__(self) -> int:
        if self.lead:
            return math.prod(self.lead)
        return self.x.shape[0] if self.by_rows else self.y.shape[1]

    def __call__(self, product: np.ndarray):
        """The function computing items start..stop-1 of ``product`` (the product's own buffer)."""
        x, y, step = self.x, self.y, self.align
        out = product.reshape(x.shape[:-1] + y.shape[-1:])  # fresh, so a view
        if self.lead:
            def matrices(start: int, stop: int) -> None:
                for i in range(start, stop):
                    at = np.unravel_index(i, self.lead)
                    np.matmul(x[at], y if y.ndim == 2 else y[at], out=out[at])
            return matrices
        if self.by_rows:
            def rows(start: int, stop: int) -> None:
                for a in range(start, stop, step):
                    np.matmul(x[a:min(a + step, stop)], y, out=out[a:min(a + step, stop)])
            return rows

        def columns(start: int, stop: int) -> None:
            for a in range(start, stop, step):
                np.matmul(x, y[:, a:min(a + step, stop)], out=out[:, a:min(a + step, stop)])
        return columns


# A matrix product is cut into _STEPS steps of a multiple of _STEP_MIN rows (or columns): fewer
# BLAS calls repack the other operand less often (256-row steps cost a 4096 × 1000 × 1000 product
# 5% against one call), more let more threads share it. One step a core, 2 to 4: on 2 cores, 4
# steps made the MLP step 3 to 4% slower than 2 (1305-1316 against 1264 ms; BENCHMARKS.md). The
# steps depend on the machine and the shape, never on ag.set_workers: the bits stay the same for
# any number of workers.
_STEPS = min(4, max(2, _threads.cores()))
_STEP_MIN = 64


def _product_blocks(x: np.ndarray, y: np.ndarray) -> _ProductBlocks | None:
    """A large product's blocks; None for a small one, a vector, a stack whose dimensions
    broadcast, a GPU array, or without threadpoolctl (BLAS shares the product among its own threads)."""
    multiply_adds = x.size * y.shape[-1]  # rows of x · K · N
    if multiply_adds < _threads.MIN_PRODUCT:  # first, as the cheapest test
        return None
    if type(x) is not np.ndarray or type(y) is not np.ndarray or x.ndim < 2 or y.ndim < 2 \
            or not _threads.have_threadpoolctl():
        return None
    if (x.ndim == 2 and y.ndim != 2) or (x.ndim > 2 and y.ndim != 2 and x.shape[:-2] != y.shape[:-2]):
        return None
    return _ProductBlocks(x, y, multiply_adds)


def _check_matmul(a: Tensor, b: Tensor) -> None:
    a_shape, b_shape = a.shape, b.shape
    if not a_shape or not b_shape:
        raise ShapeError(f"matmul: operands must have at least 1 dimension, got shapes {a_shape} "
                         f"and {b_shape} (use mul for a scalar)")
    k_a = a_shape[-1]
    k_b = b_shape[0] if len(b_shape) == 1 else b_shape[-2]
    if k_a != k_b:
        raise ShapeError(f"matmul: shapes {a_shape} and {b_shape} do not align: the last "
                         f"dimension of a ({k_a}) must equal the second-to-last of b ({k_b})")
    if len(a_shape) <= 2 and len(b_shape) <= 2:
        return
    try:
        np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    except ValueError:
        raise ShapeError(f"matmul: batch dimensions {a_shape[:-2]} and {b_shape[:-2]} of shapes "
                         f"{a_shape} and {b_shape} do not broadcast") from None


def _matmul_shape(a_shape: tuple, b_shape: tuple) -> tuple:
    return np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1])
