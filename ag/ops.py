"""The ops: each computes on NumPy arrays and states its gradient right beside it.

Every op is a plain function in the ``ag`` namespace (``ag.matmul(a, b)``) and, where
Python has one, an operator on Tensor (``a @ b``). Each reads in the same order: check the
inputs, compute the value, define ``_backward(out, saved)``, return ``make_output``. The
closure reads ``out.grad`` and ``saved[t]`` for exactly the tensors the op declared in
``saves=`` (``saved[out]`` with ``saves_output=True``), and adds into its inputs' grads with
``accumulate_grad``, which allocates lazily and undoes broadcasting.

``sum``, ``max`` and ``pow`` are the lecture's names; inside ag they are called as
``ops.sum`` so that no other module shadows Python's built-ins.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from . import trace
from .arrays import array_module
from .errors import ShapeError
from .handover import grad_to_overwrite
from .modes import config
from .tensor import Saved, Tensor, accumulate_grad, make_output, rematerialize


def as_tensor(x, like: Tensor | None = None) -> Tensor:
    """Lift a Python number or array to a constant Tensor; a number takes ``like``'s dtype rules."""
    if isinstance(x, Tensor):
        return x
    if like is not None and isinstance(x, (int, float, bool)):
        xp = np if like.value is None else array_module(like.value)
        return Tensor(xp.asarray(x, dtype=np.result_type(like.dtype, x)))
    return Tensor(x)


def _operand(op: str, x, like: Tensor | None = None) -> Tensor:
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


def _operands(op: str, a, b) -> tuple[Tensor, Tensor]:
    a = _operand(op, a, b if isinstance(b, Tensor) else None)
    return a, _operand(op, b, a)


def _broadcast(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    if shapes.count(shapes[0]) == len(shapes):  # the common case, without a generator
        return shapes[0]
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise ShapeError(f"{op}: shapes {' and '.join(map(str, shapes))} do not broadcast "
                         "(trailing dimensions must be equal or 1)") from None


def _axes(op: str, axis, ndim: int) -> tuple[int, ...]:
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


def _axis(op: str, axis: int, ndim: int) -> int:
    if not isinstance(axis, (int, np.integer)):
        raise ShapeError(f"{op}: axis must be one integer, got {axis!r}")
    return _axes(op, axis, ndim)[0]


def _expand(g: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """Put the reduced axes back as size-1 dimensions, so ``g`` broadcasts against the input."""
    if keepdims:
        return g
    shape = list(g.shape)
    for ax in axes:  # sorted, so each lands where it was
        shape.insert(ax, 1)
    return g.reshape(shape)


# ---- elementwise binary ops ----

def add(a, b) -> Tensor:
    """out = a + b;  da = dout,  db = dout  (summed over broadcast axes)."""
    a, b = _operands("add", a, b)
    _broadcast("add", a.shape, b.shape)
    value = a.value + b.value

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, out.grad)
        accumulate_grad(b, out.grad)
    return make_output(value, "add", (a, b), _backward)


def sub(a, b) -> Tensor:
    """out = a - b;  da = dout,  db = -dout."""
    a, b = _operands("sub", a, b)
    _broadcast("sub", a.shape, b.shape)
    value = a.value - b.value

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, out.grad)
        if b.requires_grad:
            accumulate_grad(b, np.negative(out.grad))
    return make_output(value, "sub", (a, b), _backward)


def mul(a, b) -> Tensor:
    """out = a * b;  da = dout * b,  db = dout * a."""
    a, b = _operands("mul", a, b)
    _broadcast("mul", a.shape, b.shape)
    value = a.value * b.value

    def _backward(out: Tensor, saved: Saved) -> None:
        if a.requires_grad:
            accumulate_grad(a, out.grad * saved[b])
        if b.requires_grad:
            accumulate_grad(b, out.grad * saved[a])
    return make_output(value, "mul", (a, b), _backward, saves=_needs(a, b))


def div(a, b) -> Tensor:
    """out = a / b;  da = dout / b,  db = -dout * a / b**2."""
    a, b = _operands("div", a, b)
    _broadcast("div", a.shape, b.shape)
    value = a.value / b.value

    def _backward(out: Tensor, saved: Saved) -> None:
        b_value = saved[b]
        if a.requires_grad:
            accumulate_grad(a, out.grad / b_value)
        if b.requires_grad:
            accumulate_grad(b, -out.grad * saved[a] / (b_value * b_value))
    return make_output(value, "div", (a, b), _backward, saves=(b,) + ((a,) if b.requires_grad else ()))


def _needs(a: Tensor, b: Tensor) -> tuple[Tensor, ...]:
    """For a product: a's gradient reads b's value and b's gradient reads a's."""
    return ((b,) if a.requires_grad else ()) + ((a,) if b.requires_grad else ())


def pow(a, exponent: float) -> Tensor:
    """out = a ** p for a number p;  da = dout * p * a ** (p - 1)."""
    a = _operand("pow", a)
    if isinstance(exponent, Tensor) or not np.isscalar(exponent):
        raise TypeError(f"pow: the exponent must be a number, got {type(exponent).__name__}")
    value = a.value ** exponent

    def _backward(out: Tensor, saved: Saved) -> None:
        if exponent == 0:  # a ** 0 is constant; a ** -1 at a = 0 would make 0 * inf = NaN
            accumulate_grad(a, np.zeros_like(out.grad))
        else:
            accumulate_grad(a, out.grad * (exponent * saved[a] ** (exponent - 1)))
    return make_output(value, "pow", (a,), _backward, saves=(a,))


def neg(a) -> Tensor:
    """out = -a;  da = -dout."""
    a = _operand("neg", a)
    value = np.negative(a.value)

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, np.negative(out.grad))
    return make_output(value, "neg", (a,), _backward)


# ---- matrix product ----

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
    """np.matmul, counted by ``ag.count_ops`` as 2·m·n·k FLOPs in the current phase; with
    ``shape``, written into a fresh array of that shape (not a reshaped view of one)."""
    if shape is None:
        product = np.matmul(x, y)
    else:
        product = np.empty_like(x, shape=shape, dtype=np.result_type(x, y))
        np.matmul(x, y, out=product.reshape(x.shape[:-1] + y.shape[-1:]))
    trace.count_matmul(config.phase, 2 * product.size * x.shape[-1])
    return product


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


# ---- reductions ----

def sum(a, axis=None, keepdims: bool = False) -> Tensor:
    """out = Σ_axis a;  da = dout broadcast back over the summed axes."""
    a = _operand("sum", a)
    axes = _axes("sum", axis, a.ndim)
    value = a.value.sum(axis=axes, keepdims=keepdims)

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, np.broadcast_to(_expand(out.grad, axes, keepdims), a.shape))
    return make_output(value, "sum", (a,), _backward)


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


def _finite_max(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Row max used as the shift; 0 where the whole row is -inf, so the shift never makes NaN."""
    m = np.max(x, axis=axes, keepdims=True)
    return np.where(np.isfinite(m), m, 0).astype(x.dtype, copy=False)


def _logsumexp(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    m = _finite_max(x, axes)
    with np.errstate(divide="ignore"):
        out = m + np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True))
    return out if keepdims else np.squeeze(out, axes)


def _exp_shifted(x: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """exp(x - lse), taking -inf - (-inf) as -inf (a row with nothing in it gets probability 0)."""
    return np.exp(x - np.where(np.isfinite(lse), lse, 0).astype(x.dtype, copy=False)) * np.isfinite(lse)


def _softmax_grad(out: Tensor, y: np.ndarray, axis: int) -> np.ndarray:
    """y ∘ (dy - Σ_axis dy ∘ y) in one buffer of y's size (dy's own when nothing reads it after)."""
    dot = np.expand_dims(np.einsum("...i,...i->...", np.moveaxis(out.grad, axis, -1), np.moveaxis(y, axis, -1)), axis)
    g = grad_to_overwrite(out)
    g -= dot
    g *= y
    return g


def softmax(a, axis: int = -1) -> Tensor:
    """y = exp(a - max) / Σ exp(a - max);  da = y * (dy - Σ_axis dy * y)."""
    a = _operand("softmax", a)
    ax = _axis("softmax", axis, a.ndim)
    y = a.value - _finite_max(a.value, (ax,))
    np.exp(y, out=y)
    total = np.sum(y, axis=ax, keepdims=True)
    # a row with every entry -inf (fully masked) has total 0: leave its zeros, no 0/0
    np.divide(y, total, out=y, where=total > 0)

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, _softmax_grad(out, saved[out], ax))
    return make_output(y, "softmax", (a,), _backward, saves_output=True)


def log_softmax(a, axis: int = -1) -> Tensor:
    """y = a - logsumexp(a);  da = dy - softmax(a) * Σ_axis dy."""
    a = _operand("log_softmax", a)
    ax = _axis("log_softmax", axis, a.ndim)
    value = a.value - _logsumexp(a.value, (ax,), keepdims=True)

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, out.grad - np.exp(saved[out]) * np.sum(out.grad, axis=ax, keepdims=True))
    return make_output(value, "log_softmax", (a,), _backward, saves_output=True)


# ---- elementwise unary ops ----

def exp(a) -> Tensor:
    """y = e^a;  da = dy * y."""
    a = _operand("exp", a)
    value = np.exp(a.value)

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, out.grad * saved[out])
    return make_output(value, "exp", (a,), _backward, saves_output=True)


def log(a) -> Tensor:
    """y = ln a;  da = dy / a."""
    a = _operand("log", a)
    value = np.log(a.value)

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, out.grad / saved[a])
    return make_output(value, "log", (a,), _backward, saves=(a,))


def sqrt(a) -> Tensor:
    """y = √a;  da = dy / (2y)."""
    a = _operand("sqrt", a)
    value = np.sqrt(a.value)

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, out.grad / (2 * saved[out]))
    return make_output(value, "sqrt", (a,), _backward, saves_output=True)


def relu(a) -> Tensor:
    """y = max(a, 0);  da = dy where y > 0, else 0 (reads only the output)."""
    a = _operand("relu", a)
    value = np.maximum(a.value, 0)

    def _backward(out: Tensor, saved: Saved) -> None:
        g = grad_to_overwrite(out)  # in place: no second grad-sized buffer
        np.multiply(g, saved[out] > 0, out=g)
        accumulate_grad(a, g)
    return make_output(value, "relu", (a,), _backward, saves_output=True)


def tanh(a) -> Tensor:
    """y = tanh a;  da = dy * (1 - y²)."""
    a = _operand("tanh", a)
    value = np.tanh(a.value)

    def _backward(out: Tensor, saved: Saved) -> None:
        y = saved[out]
        accumulate_grad(a, out.grad * (1 - y * y))
    return make_output(value, "tanh", (a,), _backward, saves_output=True)


def sigmoid(a) -> Tensor:
    """y = 1 / (1 + e^-a);  da = dy * y * (1 - y)."""
    a = _operand("sigmoid", a)
    e = np.exp(-np.abs(a.value))  # exp of -|a| only, so that large |a| never overflows
    y = np.where(a.value >= 0, 1 / (1 + e), e / (1 + e)).astype(a.dtype, copy=False)

    def _backward(out: Tensor, saved: Saved) -> None:
        y = saved[out]
        accumulate_grad(a, out.grad * y * (1 - y))
    return make_output(y, "sigmoid", (a,), _backward, saves_output=True)


_GELU_C = math.sqrt(2 / math.pi)


def gelu(a) -> Tensor:
    """y = a/2 · (1 + tanh(c(a + 0.044715 a³))), c = √(2/π);
    da = dy · (½(1 + t) + a/2 · (1 - t²) · c(1 + 3·0.044715 a²))."""
    a = _operand("gelu", a)
    y = _gelu_tanh(a.value)  # built in place: one buffer, no temporaries
    y += 1
    y *= a.value
    y *= 0.5

    def _backward(out: Tensor, saved: Saved) -> None:
        x = saved[a]
        t = _gelu_tanh(x)
        # da = g + v·(1 + 3·0.044715x²), g = dy·½(1 + t), v = g·cx(1 - t), in t and dy's own buffer
        g = grad_to_overwrite(out)
        t += 1
        g *= t
        g *= 0.5
        np.subtract(2, t, out=t)
        t *= x
        t *= _GELU_C
        t *= g
        g += t
        t *= x
        t *= x
        t *= 3 * 0.044715
        g += t
        del t
        accumulate_grad(a, g)
    return make_output(y.astype(a.dtype, copy=False), "gelu", (a,), _backward, saves=(a,))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """t = tanh(c(x + 0.044715 x³)) in one fresh buffer (x·x·x: float ** 3 is 100× slower)."""
    t = np.multiply(x, x, out=np.empty_like(x))  # an array even when x is 0-d
    t *= x
    t *= 0.044715
    t += x
    t *= _GELU_C
    return np.tanh(t, out=t)


# ---- the transformer's fused ops: each saves exactly what its backward reads ----

def layer_norm(x, gamma, beta, eps: float = 1e-5) -> Tensor:
    """y = (x - μ)/σ · γ + β over the last axis, σ = √(var + eps);  with x̂ = (x - μ)/σ and
    g = dy·γ: dx = (g - mean(g) - x̂·mean(g·x̂))/σ,  dγ = Σ dy·x̂,  dβ = Σ dy.
    Saves only x: μ and σ are recomputed in backward (the paper's count leaves them out)."""
    x, gamma, beta = (_operand("layer_norm", t) for t in (x, gamma, beta))
    if gamma.shape != (x.shape[-1],) or beta.shape != (x.shape[-1],):
        raise ShapeError(f"layer_norm: gamma {gamma.shape} and beta {beta.shape} must both have "
                         f"shape ({x.shape[-1]},), the last dimension of x {x.shape}")

    def normalized(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        wide = np.promote_types(v.dtype, np.float32)  # float16 statistics in float32
        mu = np.mean(v, axis=-1, keepdims=True, dtype=wide)
        inv_sigma = 1 / np.sqrt(np.var(v, axis=-1, keepdims=True, dtype=wide) + eps)
        return ((v - mu) * inv_sigma).astype(v.dtype, copy=False), inv_sigma

    y, _ = normalized(x.value)
    y *= gamma.value
    y += beta.value

    def _backward(out: Tensor, saved: Saved) -> None:
        x_hat, inv_sigma = normalized(saved[x])
        dy = out.grad
        axes = tuple(range(x.ndim - 1))
        if gamma.requires_grad:
            accumulate_grad(gamma, np.sum(dy * x_hat, axis=axes))
        if beta.requires_grad:
            accumulate_grad(beta, np.sum(dy, axis=axes))
        if x.requires_grad:
            g = dy * saved[gamma]
            dx = g - np.mean(g, axis=-1, keepdims=True) - x_hat * np.mean(g * x_hat, axis=-1, keepdims=True)
            accumulate_grad(x, (dx * inv_sigma).astype(x.dtype, copy=False))
    return make_output(y, "layer_norm", (x, gamma, beta), _backward, saves=(x, gamma))


def dropout(x, p: float, rng: np.random.Generator | None = None, *, mask: np.ndarray | None = None) -> Tensor:
    """y = x ∘ mask / (1 - p) with mask ~ Bernoulli(1 - p), one byte an element;  dx = dy ∘ mask / (1 - p).
    Saves only the boolean mask (in the closure): x itself is not needed. The mask is drawn
    from ``rng``, or given (a boolean array of x's shape)."""
    x = _operand("dropout", x)
    if not 0 <= p < 1:
        raise ValueError(f"dropout: p must be in [0, 1), got {p!r}")
    if mask is None:
        if rng is None:
            raise ValueError("dropout: give rng (a numpy Generator) or a mask")
        mask = array_module(x.value).asarray(rng.random(x.shape, dtype=np.float32) >= p)
    elif mask.dtype != np.bool_ or mask.shape != x.shape:
        raise ShapeError(f"dropout: mask must be boolean of shape {x.shape}, got {mask.dtype} {mask.shape}")
    keep = x.dtype.type(1 / (1 - p))
    y = x.value * mask
    y *= keep

    def _backward(out: Tensor, saved: Saved) -> None:
        g = grad_to_overwrite(out)
        g *= mask
        g *= keep
        accumulate_grad(x, g)
    return make_output(y, "dropout", (x,), _backward)


def scaled_masked_softmax(scores, scale: float, causal: bool = False) -> Tensor:
    """y = softmax(scale · s + mask) over the last axis, the causal mask top-left aligned (query i
    sees keys 0..i);  ds = scale · y ∘ (dy - Σ dy ∘ y). Saves only y: the scores can go."""
    s = _operand("scaled_masked_softmax", scores)
    if s.ndim < 2:
        raise ShapeError(f"scaled_masked_softmax: scores need at least 2 dimensions (queries, keys), "
                         f"got shape {s.shape}")

    y = s.value * s.dtype.type(scale)
    if causal:
        n_q, n_k = s.shape[-2:]
        xp = array_module(y)
        np.copyto(y, -np.inf, where=xp.arange(n_k)[None, :] > xp.arange(n_q)[:, None])  # one pass
    y -= _finite_max(y, (y.ndim - 1,)).astype(y.dtype, copy=False)
    np.exp(y, out=y)
    total = np.sum(y, axis=-1, keepdims=True)
    np.divide(y, total, out=y, where=total > 0)  # a fully masked row stays 0

    def _backward(out: Tensor, saved: Saved) -> None:
        g = _softmax_grad(out, saved[out], out.ndim - 1)
        g *= g.dtype.type(scale)
        accumulate_grad(s, g)
    return make_output(y, "scaled_masked_softmax", (s,), _backward, saves_output=True)


# ---- shape ops ----

def reshape(a, *shape) -> Tensor:
    """out = a viewed with a new shape;  da = dout reshaped back."""
    a = _operand("reshape", a)
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    try:
        value = a.value.reshape(shape)
    except ValueError:
        raise ShapeError(f"reshape: cannot reshape a tensor of shape {a.shape} "
                         f"({a.size} elements) to {shape}") from None

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, out.grad.reshape(a.shape))
    return make_output(value, "reshape", (a,), _backward)


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

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(a, np.transpose(out.grad, inverse))
    return make_output(value, "transpose", (a,), _backward)


def getitem(a, index) -> Tensor:
    """out = a[index];  da = dout scattered back into zeros of a's shape (summed where repeated)."""
    a = _operand("getitem", a)
    index = _plain_index(index)
    try:
        value = a.value[index]
    except (IndexError, TypeError) as error:
        raise ShapeError(f"getitem: index {index!r} does not fit shape {a.shape}: {error}") from None
    basic = _is_basic(index)

    def _backward(out: Tensor, saved: Saved) -> None:
        g = np.zeros_like(out.grad, shape=a.shape)
        if basic:
            g[index] = out.grad
        else:
            np.add.at(g, index, out.grad)
        accumulate_grad(a, g)
    return make_output(value, "getitem", (a,), _backward)


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
    first = tensors[0].shape
    for t in tensors[1:]:
        if t.ndim != len(first) or any(n != m for i, (n, m) in enumerate(zip(t.shape, first)) if i != ax):
            raise ShapeError(f"concat: shapes {[x.shape for x in tensors]} differ outside axis {ax}")
    ends = np.cumsum([t.shape[ax] for t in tensors])[:-1]
    value = np.concatenate([t.value for t in tensors], axis=ax)

    def _backward(out: Tensor, saved: Saved) -> None:
        for t, g in zip(tensors, np.split(out.grad, ends, axis=ax)):
            accumulate_grad(t, g)
    return make_output(value, "concat", tensors, _backward)


def where(condition, a, b) -> Tensor:
    """out = a where condition else b;  da = dout where condition,  db = dout elsewhere."""
    cond = condition.value if isinstance(condition, Tensor) else condition
    if not (hasattr(cond, "shape") and getattr(cond, "dtype", None) == np.bool_):
        raise TypeError(f"where: condition must be a boolean array, got "
                        f"{getattr(cond, 'dtype', type(cond).__name__)}")
    a, b = _operands("where", a, b)
    _broadcast("where", cond.shape, a.shape, b.shape)
    value = np.where(cond, a.value, b.value)

    def _backward(out: Tensor, saved: Saved) -> None:
        zero = out.grad.dtype.type(0)
        if a.requires_grad:
            accumulate_grad(a, np.where(cond, out.grad, zero))
        if b.requires_grad:
            accumulate_grad(b, np.where(cond, zero, out.grad))
    return make_output(value, "where", (a, b), _backward)


# ---- operators on Tensor ----

def _reflected(op):
    return lambda self, other: op(other, self)


Tensor.__add__ = add
Tensor.__radd__ = _reflected(add)
Tensor.__sub__ = sub
Tensor.__rsub__ = _reflected(sub)
Tensor.__mul__ = mul
Tensor.__rmul__ = _reflected(mul)
Tensor.__truediv__ = div
Tensor.__rtruediv__ = _reflected(div)
Tensor.__matmul__ = matmul
Tensor.__rmatmul__ = _reflected(matmul)
Tensor.__pow__ = pow
Tensor.__neg__ = neg
Tensor.__getitem__ = getitem
Tensor.T = property(lambda self: transpose(self))
Tensor.sum = sum
Tensor.mean = mean
Tensor.max = max
Tensor.exp = exp
Tensor.log = log
Tensor.sqrt = sqrt
Tensor.relu = relu
Tensor.tanh = tanh
Tensor.sigmoid = sigmoid
Tensor.reshape = reshape
Tensor.transpose = transpose
Tensor.softmax = softmax
