"""The transformer's fused ops (layer_norm, dropout, scaled_masked_softmax), each saving exactly what backward reads."""
from __future__ import annotations

import numpy as np

from ..arrays import array_module
from ..errors import ShapeError
from ..handover import grad_to_overwrite
from ..tensor import Saved, Tensor, accumulate_grad, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from . import threads as _threads
from .operands import operand as _operand
from .reductions import divide_by_row_sums, finite_max as _finite_max, softmax_grad as _softmax_grad


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

    xp = array_module(s.value)
    n_q, n_k = s.shape[-2:]
    scale = s.dtype.type(scale)

    def softmax_rows(y_) -> None:  # y_ holds scale · s on entry
        if causal:  # a temporary of this pass: held for the whole op, it raised the op's peak
            np.copyto(y_, -np.inf, where=xp.arange(n_k)[None, :] > xp.arange(n_q)[:, None])
        y_ -= _finite_max(y_, (y_.ndim - 1,)).astype(y_.dtype, copy=False)
        np.exp(y_, out=y_)
        divide_by_row_sums(y_, -1)
    if type(s.value) is np.ndarray and s.value.flags.c_contiguous:  # the stack of (n_q, n_k) as views
        y = np.empty_like(s.value)
        scores3, y3 = s.value.reshape(-1, n_q, n_k), y.reshape(-1, n_q, n_k)

        def matrices(start: int, stop: int) -> None:
            softmax_rows(np.multiply(scores3[start:stop], scale, out=y3[start:stop]))
        _threads.in_blocks(matrices, len(y3), y.size, _threads.MIN_PASS)
    else:
        y = s.value * scale
        softmax_rows(y)

    def _backward(out: Tensor, saved: Saved) -> None:
        accumulate_grad(s, _softmax_grad(out, saved[out], out.ndim - 1, scale))
    return make_output(y, "scaled_masked_softmax", (s,), _backward, saves_output=True)
