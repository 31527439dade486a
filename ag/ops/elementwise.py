"""The elementwise binary ops (add, sub, mul, div, pow to a number) and neg."""
from __future__ import annotations

import numpy as np

from ..tensor import Grads, Saved, Tensor, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from .operands import broadcast as _broadcast, needs as _needs, operand as _operand, operands as _operands


def add(a, b) -> Tensor:
    """out = a + b;  da = dout,  db = dout  (summed over broadcast axes)."""
    a, b = _operands("add", a, b)
    _broadcast("add", a.shape, b.shape)
    value = a.value + b.value

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return out.grad, out.grad
    return make_output(value, "add", (a, b), _backward, call=(add, a, b))


def sub(a, b) -> Tensor:
    """out = a - b;  da = dout,  db = -dout."""
    a, b = _operands("sub", a, b)
    _broadcast("sub", a.shape, b.shape)
    value = a.value - b.value

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return out.grad, (np.negative(out.grad) if b.requires_grad else None)
    return make_output(value, "sub", (a, b), _backward, call=(sub, a, b))


def mul(a, b) -> Tensor:
    """out = a * b;  da = dout * b,  db = dout * a."""
    a, b = _operands("mul", a, b)
    _broadcast("mul", a.shape, b.shape)
    value = a.value * b.value

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (out.grad * saved[b] if a.requires_grad else None,
                out.grad * saved[a] if b.requires_grad else None)
    return make_output(value, "mul", (a, b), _backward, saves=_needs(a, b), call=(mul, a, b))


def div(a, b) -> Tensor:
    """out = a / b;  da = dout / b,  db = -dout * a / b**2."""
    a, b = _operands("div", a, b)
    _broadcast("div", a.shape, b.shape)
    value = a.value / b.value

    def _backward(out: Tensor, saved: Saved) -> Grads:
        b_value = saved[b]
        return (out.grad / b_value if a.requires_grad else None,
                -out.grad * saved[a] / (b_value * b_value) if b.requires_grad else None)
    return make_output(value, "div", (a, b), _backward, saves=(b, a) if b.requires_grad else (b,), call=(div, a, b))


def pow(a, exponent: float) -> Tensor:
    """out = a ** p for a number p;  da = dout * p * a ** (p - 1)."""
    a = _operand("pow", a)
    if isinstance(exponent, Tensor) or not np.isscalar(exponent):
        raise TypeError(f"pow: the exponent must be a number, got {type(exponent).__name__}")
    value = a.value ** exponent

    def _backward(out: Tensor, saved: Saved) -> Grads:
        if exponent == 0:  # a ** 0 is constant; a ** -1 at a = 0 would make 0 * inf = NaN
            return (np.zeros_like(out.grad),)
        return (out.grad * (exponent * saved[a] ** (exponent - 1)),)
    return make_output(value, "pow", (a,), _backward, saves=(a,), call=(pow, a, exponent))


def neg(a) -> Tensor:
    """out = -a;  da = -dout."""
    a = _operand("neg", a)
    value = np.negative(a.value)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (np.negative(out.grad),)
    return make_output(value, "neg", (a,), _backward, call=(neg, a))
