"""The elementwise unary ops: exp, log, sqrt, relu, tanh, sigmoid and gelu."""
from __future__ import annotations

import math

import numpy as np

from ..handover import grad_to_overwrite
from ..tensor import Saved, Tensor, accumulate_grad, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from . import threads as _threads
from .operands import operand as _operand


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
    if a.value.size < _threads.MIN_PASS or type(a.value) is not np.ndarray:  # small first: just np.maximum
        value = np.maximum(a.value, _zero(a.value))
    else:
        value = np.empty_like(a.value)
        _threads.elementwise(lambda y, x: np.maximum(x, _zero(x), out=y), value, a.value)

    def _backward(out: Tensor, saved: Saved) -> None:
        g = grad_to_overwrite(out)  # in place: no second grad-sized buffer
        _threads.elementwise(_relu_grad, g, saved[out])
        accumulate_grad(a, g)
    return make_output(value, "relu", (a,), _backward, saves_output=True)


def _relu_grad(g: np.ndarray, y: np.ndarray) -> None:
    np.multiply(g, y > 0, out=g)


def _zero(x):
    """0 in the dtype of x: for a NumPy float array, a 0-d array made once per dtype, which
    np.maximum takes without converting a Python 0 on every call (np.maximum on a 4-element
    array, 0.47 -> 0.28 us). Anything else (ints, GPU arrays) gets the Python 0."""
    return _ZEROS.get(x.dtype, 0) if type(x) is np.ndarray else 0


_ZEROS = {np.dtype(t): np.zeros((), t) for t in (np.float16, np.float32, np.float64, np.longdouble)}
for _z in _ZEROS.values():
    _z.flags.writeable = False
del _z


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
    _threads.elementwise(_gelu_from_tanh, y, a.value)

    def _backward(out: Tensor, saved: Saved) -> None:
        x = saved[a]
        t = _gelu_tanh(x)
        g = grad_to_overwrite(out)
        _threads.elementwise(_gelu_grad_from_tanh, g, t, x)
        del t
        accumulate_grad(a, g)
    return make_output(y.astype(a.dtype, copy=False), "gelu", (a,), _backward, saves=(a,))


def _gelu_from_tanh(y: np.ndarray, x: np.ndarray) -> None:
    """y = x/2 · (1 + y), y holding t = tanh(c(x + 0.044715 x³)) on entry."""
    y += 1
    y *= x
    y *= 0.5


def _gelu_grad_from_tanh(g: np.ndarray, t: np.ndarray, x: np.ndarray) -> None:
    """da = g + v·(1 + 3·0.044715x²), g = dy·½(1 + t), v = g·cx(1 - t), in t and dy's own buffer."""
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


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """t = tanh(c(x + 0.044715 x³)) in one fresh buffer (x·x·x: float ** 3 is 100× slower)."""
    t = np.empty_like(x)  # an array even when x is 0-d
    _threads.elementwise(_tanh_inner, t, x)
    return t


def _tanh_inner(t: np.ndarray, x: np.ndarray) -> None:
    np.multiply(x, x, out=t)
    t *= x
    t *= 0.044715
    t += x
    t *= _GELU_C
    np.tanh(t, out=t)
