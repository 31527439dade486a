"""The transformer's fused ops (layer_norm, dropout, scaled_masked_softmax), each saving exactly what backward reads."""
from __future__ import annotations

import numpy as np

from ..arrays import array_module
from ..errors import ShapeError
from ..tensor import Grads, Saved, Tensor, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from .kernels import KERNELS, classroom
from .operands import operand as _operand
from .reductions import divide_by_row_sums, finite_max as _finite_max


def layer_norm(x, gamma, beta, eps: float = 1e-5) -> Tensor:
    """y = (x - μ)/σ · γ + β over the last axis, σ = √(var + eps);  with x̂ = (x - μ)/σ and
    g = dy·γ: dx = (g - mean(g) - x̂·mean(g·x̂))/σ,  dγ = Σ dy·x̂,  dβ = Σ dy.
    Saves only x: μ and σ are recomputed in backward (the paper's count leaves them out)."""
    x, gamma, beta = (_operand("layer_norm", t) for t in (x, gamma, beta))
    if gamma.shape != (x.shape[-1],) or beta.shape != (x.shape[-1],):
        raise ShapeError(f"layer_norm: gamma {gamma.shape} and beta {beta.shape} must both have "
                         f"shape ({x.shape[-1]},), the last dimension of x {x.shape}")
    y = np.empty_like(x.value)
    KERNELS.layer_norm(y, x.value, eps)  # y = x̂
    y *= gamma.value
    y += beta.value

    def _backward(out: Tensor, saved: Saved) -> Grads:
        dy = out.grad
        x_hat = np.empty_like(saved[x])
        dx = np.empty_like(saved[x]) if x.requires_grad else None
        KERNELS.layer_norm_grad(x_hat, dx, dy, saved[x], saved[gamma], eps)
        axes = tuple(range(x.ndim - 1))
        return (dx, np.sum(dy * x_hat, axis=axes) if gamma.requires_grad else None,
                np.sum(dy, axis=axes) if beta.requires_grad else None)
    return make_output(y, "layer_norm", (x, gamma, beta), _backward, saves=(x, gamma),
                       call=(layer_norm, x, gamma, beta, eps))


@classroom("layer_norm")
def _normalize_into(x_hat: np.ndarray, x: np.ndarray, eps: float) -> np.ndarray:
    """x̂ = (x - μ)/σ over the last axis, into ``x_hat``; returns 1/σ (float16's in float32)."""
    wide = np.promote_types(x.dtype, np.float32)
    mu = np.mean(x, axis=-1, keepdims=True, dtype=wide)
    inv_sigma = 1 / np.sqrt(np.var(x, axis=-1, keepdims=True, dtype=wide) + eps)
    if x.dtype == wide:
        np.multiply(np.subtract(x, mu, out=x_hat), inv_sigma, out=x_hat)
    else:
        x_hat[...] = (x - mu) * inv_sigma
    return inv_sigma


@classroom("layer_norm_grad")
def _layer_norm_grad_into(x_hat: np.ndarray, dx: np.ndarray | None, dy: np.ndarray, x: np.ndarray,
                          gamma: np.ndarray, eps: float) -> None:
    """x̂ into ``x_hat`` and, unless ``dx`` is None, dx = (g - mean(g) - x̂·mean(g·x̂))/σ with
    g = dy·γ into ``dx``, row by row."""
    inv_sigma = _normalize_into(x_hat, x, eps)
    if dx is None:
        return
    g = dy * gamma
    mean_g, mean_gx = np.mean(g, axis=-1, keepdims=True), np.mean(g * x_hat, axis=-1, keepdims=True)
    g -= mean_g
    g -= x_hat * mean_gx
    if np.result_type(g, inv_sigma) == dx.dtype:
        np.multiply(g, inv_sigma, out=dx)
    else:
        dx[...] = g * inv_sigma


# a dropout mask's elements drawn by one generator: this cut fixes the mask
MASK_CHUNK = 1 << 19


def keep_mask(rng: np.random.Generator, shape: tuple[int, ...], p: float) -> np.ndarray:
    """A Bernoulli(1 - p) boolean array of ``shape``, on the host: an element is kept where a
    uniform 32-bit integer is at least p · 2^32, rounded. ``rng`` gives one seed; chunk c of
    ``MASK_CHUNK`` elements is drawn from its own PCG64 seeded with (seed, c), so the chunks
    may be drawn in any order and the mask stays the same."""
    threshold = min(round(p * 2.0 ** 32), 2 ** 32 - 1)
    seed = int(rng.integers(2 ** 63))
    mask = np.empty(shape, np.bool_)
    KERNELS.keep_mask(mask.reshape(-1), seed, threshold)  # a view: the chunks are drawn into mask
    return mask


@classroom("keep_mask")
def _draw_chunks(mask: np.ndarray, seed: int, threshold: int, first: int = 0, stop: int | None = None) -> None:
    """mask's chunks ``first`` to ``stop`` - 1 (all by default): True where a draw >= threshold."""
    n = mask.size
    for c in range(first, -(-n // MASK_CHUNK) if stop is None else stop):
        start, end = c * MASK_CHUNK, min(n, (c + 1) * MASK_CHUNK)
        raw = np.random.PCG64((seed, c)).random_raw(-(-(end - start) // 2)).view(np.uint32)
        np.greater_equal(raw[:end - start], threshold, out=mask[start:end])


def dropout(x, p: float, rng: np.random.Generator | None = None, mask: np.ndarray | None = None) -> Tensor:
    """y = x ∘ mask / (1 - p) with mask ~ Bernoulli(1 - p), one byte an element;  dx = dy ∘ mask / (1 - p).
    Saves only the boolean mask (in the closure): x itself is not needed. The mask is drawn
    from ``rng`` (``keep_mask``), or given (a boolean array of x's shape)."""
    x = _operand("dropout", x)
    if not 0 <= p < 1:
        raise ValueError(f"dropout: p must be in [0, 1), got {p!r}")
    if mask is None:
        if rng is None:
            raise ValueError("dropout: give rng (a numpy Generator) or a mask")
        mask = array_module(x.value).asarray(keep_mask(rng, x.shape, p))
    elif mask.dtype != np.bool_ or mask.shape != x.shape:
        raise ShapeError(f"dropout: mask must be boolean of shape {x.shape}, got {mask.dtype} {mask.shape}")
    keep = x.dtype.type(1 / (1 - p))
    y = x.value * mask
    y *= keep

    def _backward(out: Tensor, saved: Saved) -> Grads:
        g = saved.writable_grad()
        KERNELS.multiply(g, mask, out=g)
        KERNELS.multiply(g, keep, out=g)
        return (g,)
    return make_output(y, "dropout", (x,), _backward, call=(dropout, x, p, None, mask))


def scaled_masked_softmax(scores, scale: float, causal: bool = False) -> Tensor:
    """y = softmax(scale · s + mask) over the last axis, the causal mask top-left aligned (query i
    sees keys 0..i);  ds = scale · y ∘ (dy - Σ dy ∘ y). Saves only y: the scores can go."""
    s = _operand("scaled_masked_softmax", scores)
    if s.ndim < 2:
        raise ShapeError(f"scaled_masked_softmax: scores need at least 2 dimensions (queries, keys), "
                         f"got shape {s.shape}")
    y = np.empty_like(s.value)
    KERNELS.scaled_masked_softmax(y, s.value, s.dtype.type(scale), causal)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        g = saved.writable_grad()  # each row reads its dy before it writes it
        KERNELS.softmax_grad(g, saved[out], out.ndim - 1, scale)
        return (g,)
    return make_output(y, "scaled_masked_softmax", (s,), _backward, saves_output=True,
                       call=(scaled_masked_softmax, s, scale, causal))


@classroom("scaled_masked_softmax")
def _masked_softmax_into(y: np.ndarray, s: np.ndarray, scale, causal: bool) -> None:
    """y = softmax(scale · s + mask) over the last axis, into ``y``, for a stack of (queries, keys)."""
    np.multiply(s, scale, out=y)
    n_q, n_k = y.shape[-2:]
    if causal:
        xp = array_module(y)
        np.copyto(y, -np.inf, where=xp.arange(n_k)[None, :] > xp.arange(n_q)[:, None])
    y -= _finite_max(y, (y.ndim - 1,))
    KERNELS.exp(y, out=y)
    divide_by_row_sums(y, -1)
