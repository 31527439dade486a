"""The matrix product: matmul and linear (x @ w + b), each product counted by ``ag.count_ops``."""
from __future__ import annotations

import numpy as np

from .. import hooks
from ..device_matmul import device_product
from ..errors import ShapeError
from ..modes import config
from ..tensor import Grads, Saved, Tensor, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from .kernels import KERNELS
from .operands import broadcast as _broadcast, needs as _needs, operand as _operand, operands as _operands


def matmul(a, b) -> Tensor:
    """out = a @ b (leading dims broadcast);  da = dout @ b^T,  db = a^T @ dout."""
    a, b = _operands("matmul", a, b)
    _check_matmul(a, b)
    value = _product(a.value, b.value)
    a_vector, b_vector = a.ndim == 1, b.ndim == 1

    def _backward(out: Tensor, saved: Saved) -> Grads:
        g = out.grad
        # as np.matmul does: a vector a is a one-row matrix, a vector b a one-column one
        g = np.expand_dims(g, -1) if b_vector else g
        g = np.expand_dims(g, -2) if a_vector else g
        ga = gb = None
        if a.requires_grad:
            ga = _product(g, np.swapaxes(_as_matrix(saved[b], row=False), -1, -2))
            ga = ga[..., 0, :] if a_vector else ga
        if b.requires_grad:
            gb = _product(np.swapaxes(_as_matrix(saved[a], row=True), -1, -2), g)
            gb = gb[..., 0] if b_vector else gb
        return ga, gb
    return make_output(value, "matmul", (a, b), _backward, saves=_needs(a, b), call=(matmul, a, b))


def _as_matrix(x: np.ndarray, row: bool) -> np.ndarray:
    """A 1-D array as a one-row matrix (``row``) or a one-column one; else unchanged."""
    return x if x.ndim != 1 else (x[None, :] if row else x[:, None])


def linear(x, w, b=None) -> Tensor:
    """out = x @ w + b in one buffer (as torch's addmm);  dx = dout @ w^T,  dw = x^T @ dout,
    db = Σ dout over all but the last axis."""
    x, w = _operands("linear", x, w)
    _check_linear(x, w)
    if b is not None:
        b = _operand("linear", b, x)
        if b.shape != (w.shape[1],):
            raise ShapeError(f"linear: bias of shape {b.shape} does not match weight {w.shape}: "
                             f"expected ({w.shape[1]},)")
    # (s, b, h) as one (s·b, h) product, into a fresh buffer of the output's shape
    value = _product(x.value.reshape(-1, x.shape[-1]), w.value, x.shape[:-1] + (w.shape[1],))
    if b is not None:
        value += b.value

    def _backward(out: Tensor, saved: Saved) -> Grads:
        g = out.grad.reshape(-1, out.shape[-1])
        dx = _product(g, saved[w].T, x.shape) if x.requires_grad else None
        dw = _product(saved[x].reshape(-1, x.shape[-1]).T, g) if w.requires_grad else None
        if b is None:
            return dx, dw
        return dx, dw, (g.sum(axis=0) if b.requires_grad else None)
    inputs = (x, w) if b is None else (x, w, b)
    return make_output(value, "linear", inputs, _backward, saves=_needs(x, w), call=(linear, x, w, b))


def _product(x: np.ndarray, y: np.ndarray, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """x @ y, published as 2·m·n·k FLOPs ("product counted", for ``ag.count_ops``); with ``shape``,
    written into a fresh array of that shape (a reshaped view is one a grad could not own)."""
    if shape is not None:
        product = np.empty_like(x, shape=shape, dtype=np.result_type(x, y))
        KERNELS.matmul(x, y, out=product.reshape(x.shape[:-1] + y.shape[-1:]))
    else:
        product = KERNELS.matmul(x, y) if type(x) is np.ndarray else device_product(x, y)
    if config.watchers:  # count_ops among them
        hooks.publish("product counted", 2 * product.size * x.shape[-1])
    return product


def _check_linear(x: Tensor, w: Tensor) -> None:
    if w.ndim != 2 or x.ndim < 1:
        raise ShapeError(f"linear: weight must be 2-D (in, out) and x at least 1-D, got shapes "
                         f"{x.shape} and {w.shape}")
    _check_matmul(x, w)


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
    if len(a_shape) > 2 or len(b_shape) > 2:
        _broadcast("matmul's batch dimensions", a_shape[:-2], b_shape[:-2])
