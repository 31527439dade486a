"""The elementwise unary ops: exp, log, sqrt, relu, tanh, sigmoid and gelu."""
from __future__ import annotations

import math

import numpy as np

from ..tensor import Grads, Saved, Tensor, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from .kernels import KERNELS, classroom
from .operands import operand as _operand


def exp(a) -> Tensor:
    """y = e^a;  da = dy * y."""
    a = _operand("exp", a)
    value = np.exp(a.value)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (out.grad * saved[out],)
    return make_output(value, "exp", (a,), _backward, saves_output=True, call=(exp, a))


def log(a) -> Tensor:
    """y = ln a;  da = dy / a."""
    a = _operand("log", a)
    value = np.log(a.value)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (out.grad / saved[a],)
    return make_output(value, "log", (a,), _backward, saves=(a,), call=(log, a))


def sqrt(a) -> Tensor:
    """y = √a;  da = dy / (2y)."""
    a = _operand("sqrt", a)
    value = np.sqrt(a.value)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (out.grad / (2 * saved[out]),)
    return make_output(value, "sqrt", (a,), _backward, saves_output=True, call=(sqrt, a))


def relu(a) -> Tensor:
    """y = max(a, 0);  da = dy where y > 0, else 0 (reads only the output)."""
    a = _operand("relu", a)
    value = KERNELS.maximum(a.value, 0)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        g = saved.writable_grad()  # in place: no second grad-sized buffer
        KERNELS.multiply(g, saved[out] > 0, out=g)
        return (g,)
    return make_output(value, "relu", (a,), _backward, saves_output=True, call=(relu, a))


def tanh(a) -> Tensor:
    """y = tanh a;  da = dy * (1 - y²)."""
    a = _operand("tanh", a)
    value = np.tanh(a.value)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        y = saved[out]
        return (out.grad * (1 - y * y),)
    return make_output(value, "tanh", (a,), _backward, saves_output=True, call=(tanh, a))


def sigmoid(a) -> Tensor:
    """y = 1 / (1 + e^-a);  da = dy * y * (1 - y)."""
    a = _operand("sigmoid", a)
    e = np.exp(-np.abs(a.value))  # exp of -|a| only, so that large |a| never overflows
    y = np.where(a.value >= 0, 1 / (1 + e), e / (1 + e)).astype(a.dtype, copy=False)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        y = saved[out]
        return (out.grad * y * (1 - y),)
    return make_output(y, "sigmoid", (a,), _backward, saves_output=True, call=(sigmoid, a))


_GELU_C = math.sqrt(2 / math.pi)


def gelu(a) -> Tensor:
    """y = a/2 · (1 + tanh(c(a + 0.044715 a³))), c = √(2/π);
    da = dy · (½(1 + t) + a/2 · (1 - t²) · c(1 + 3·0.044715 a²))."""
    a = _operand("gelu", a)
    y = np.empty_like(a.value)  # built in place: one buffer, no temporaries
    KERNELS.gelu(y, a.value)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        g = saved.writable_grad()
        KERNELS.gelu_grad(g, saved[a])
        return (g,)
    return make_output(y.astype(a.dtype, copy=False), "gelu", (a,), _backward, saves=(a,), call=(gelu, a))


@classroom("gelu")
def _gelu_into(y: np.ndarray, x: np.ndarray) -> None:
    """y = x/2 · (1 + t), t = tanh(c(x + 0.044715 x³)), in y's buffer."""
    _tanh_inner(y, x)
    y += 1
    y *= x
    y *= 0.5


@classroom("gelu_grad")
def _gelu_grad_into(g: np.ndarray, x: np.ndarray) -> None:
    """g = dy · gelu'(x) in dy's buffer, with t = tanh(c(x + 0.044715 x³)) its one temporary:
    g = dy·½(1 + t) + v·(1 + 3·0.044715x²), v = dy·½(1 + t)·cx(1 - t)."""
    t = np.empty_like(x)
    _tanh_inner(t, x)
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


def _tanh_inner(t: np.ndarray, x: np.ndarray) -> None:
    """t = tanh(c(x + 0.044715 x³)) in t's buffer (x·x·x: float ** 3 is far slower)."""
    np.multiply(x, x, out=t)
    t *= x
    t *= 0.044715
    t += x
    t *= _GELU_C
    np.tanh(t, out=t)
