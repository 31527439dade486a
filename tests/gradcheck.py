"""Gradient checks for the tests: central differences, and PyTorch as an oracle.

``grad_check`` reduces ``f``'s output to one number with a fixed random weighting R,
``loss = Σ f(x) · R``, so that every element of a non-scalar output is checked, then
compares each input's ``.grad`` with the central difference
``(loss(x + ε e_i) - loss(x - ε e_i)) / 2ε``.

``torch_check`` runs the same function in ``ag`` and in PyTorch (float64, CPU) with the
same upstream gradient and compares the outputs and every input's gradient.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

import ag


def _describe(f: Callable) -> str:
    return getattr(f, "__qualname__", None) or repr(f)


def _float64_inputs(f: Callable, arrays) -> list[np.ndarray]:
    inputs = [np.asarray(a) for a in arrays]
    for i, a in enumerate(inputs):
        if a.dtype != np.float64:
            raise TypeError(f"grad check of {_describe(f)}: input {i} has dtype {a.dtype}; "
                            "gradient checks need float64 inputs")
    return inputs


def _weighting(shape: tuple[int, ...]) -> np.ndarray:
    """R: fixed random weights, so the check is repeatable and no output element cancels out."""
    rng = np.random.default_rng(1234)
    return rng.uniform(0.5, 1.5, size=shape) * rng.choice([-1.0, 1.0], size=shape)


def _loss_value(f: Callable, arrays: list[np.ndarray], weights: np.ndarray) -> float:
    with ag.no_grad():
        out = f(*(ag.Tensor(a) for a in arrays))
    return float(np.sum(out.value * weights))


def _numeric_grad(f: Callable, arrays: list[np.ndarray], i: int, weights: np.ndarray,
                  eps: float) -> np.ndarray:
    """d loss / d arrays[i] by central differences, one element at a time."""
    x = arrays[i]
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        original = x[index]
        x[index] = original + eps
        plus = _loss_value(f, arrays, weights)
        x[index] = original - eps
        minus = _loss_value(f, arrays, weights)
        x[index] = original
        grad[index] = (plus - minus) / (2 * eps)
    return grad


def grad_check(f: Callable, *arrays, eps: float = 1e-6, rtol: float = 1e-6,
               atol: float = 1e-8) -> None:
    """Assert that backward through ``f`` matches central differences for every input.

    Raises AssertionError naming the op, the input, the worst element and both values.
    """
    inputs = _float64_inputs(f, arrays)
    tensors = [ag.Tensor(a.copy(), requires_grad=True) for a in inputs]
    out = f(*tensors)
    weights = _weighting(out.shape)
    loss = ag.sum(out * weights)
    loss.backward()
    for i, (t, x) in enumerate(zip(tensors, inputs)):
        numeric = _numeric_grad(f, [a.copy() for a in inputs], i, weights, eps)
        where = f"grad check of {_describe(f)} (output op {out.op!r}), input {i} of shape {x.shape}"
        if t.grad is None:
            if np.any(np.abs(numeric) > atol):
                raise AssertionError(f"{where}: backward gave no gradient, but central "
                                     f"differences give a nonzero one:\n{numeric}")
            continue
        analytic = t.grad
        if analytic.shape != x.shape:
            raise AssertionError(f"{where}: the gradient has shape {analytic.shape}, "
                                 f"expected the input's shape {x.shape}")
        excess = np.abs(analytic - numeric) - (atol + rtol * np.abs(numeric))
        if np.all(excess <= 0):
            continue
        worst = np.unravel_index(np.argmax(np.where(np.isnan(excess), np.inf, excess)), x.shape)
        raise AssertionError(
            f"{where}: gradient mismatch at element {tuple(int(j) for j in worst)}: "
            f"analytic {float(analytic[worst])!r}, numeric {float(numeric[worst])!r} "
            f"(rtol={rtol}, atol={atol}; {int(np.sum(~(excess <= 0)))} of {x.size} "
            f"elements off)")


def torch_check(f_ag: Callable, f_torch: Callable, *arrays, rtol: float = 1e-7,
                atol: float = 1e-10) -> None:
    """Assert that ``f_ag`` in ag and ``f_torch`` in PyTorch agree on the output and,
    for one random upstream gradient, on every input's gradient."""
    import torch

    inputs = _float64_inputs(f_ag, arrays)
    tensors = [ag.Tensor(a.copy(), requires_grad=True) for a in inputs]
    torch_tensors = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in inputs]
    out = f_ag(*tensors)
    torch_out = f_torch(*torch_tensors)
    name = f"{_describe(f_ag)} vs {_describe(f_torch)}"
    np.testing.assert_allclose(out.value, torch_out.detach().numpy(), rtol=rtol, atol=atol,
                               err_msg=f"{name}: outputs differ")
    upstream = np.random.default_rng(99).standard_normal(out.shape)
    out.backward(upstream)
    torch_out.backward(torch.from_numpy(upstream))
    for i, (t, tt) in enumerate(zip(tensors, torch_tensors)):
        expected = np.zeros(inputs[i].shape) if tt.grad is None else tt.grad.numpy()
        actual = np.zeros(inputs[i].shape) if t.grad is None else t.grad
        assert actual.shape == expected.shape, (
            f"{name}: grad of input {i} has shape {actual.shape}, torch's has {expected.shape}")
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol,
                                   err_msg=f"{name}: grads of input {i} differ")


# the four broadcasting binary ops, as operators (the same lambdas run on ag and torch tensors)
BINARY_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
}
