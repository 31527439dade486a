"""The transformer's fused ops (layer_norm, dropout, scaled_masked_softmax), each saving exactly what backward reads."""
from __future__ import annotations

import math

import numpy as np

from ..arrays import array_module
from ..errors import ShapeError
from ..handover import grad_to_overwrite
from ..tensor import Saved, Tensor, accumulate_grad, make_output
# the helpers the ops share, bound under private names: they are not ops of this module
from . import threads as _threads
from .operands import operand as _operand
from .reductions import divide_by_row_sums, exp_flushed as _exp_flushed, finite_max as _finite_max, \
    softmax_grad as _softmax_grad


def layer_norm(x, gamma, beta, eps: float = 1e-5) -> Tensor:
    """y = (x - μ)/σ · γ + β over the last axis, σ = √(var + eps);  with x̂ = (x - μ)/σ and
    g = dy·γ: dx = (g - mean(g) - x̂·mean(g·x̂))/σ,  dγ = Σ dy·x̂,  dβ = Σ dy.
    Saves only x: μ and σ are recomputed in backward (the paper's count leaves them out)."""
    x, gamma, beta = (_operand("layer_norm", t) for t in (x, gamma, beta))
    if gamma.shape != (x.shape[-1],) or beta.shape != (x.shape[-1],):
        raise ShapeError(f"layer_norm: gamma {gamma.shape} and beta {beta.shape} must both have "
                         f"shape ({x.shape[-1]},), the last dimension of x {x.shape}")

    def normalized(v: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        wide = np.promote_types(v.dtype, np.float32)  # float16 statistics in float32
        mu = np.mean(v, axis=-1, keepdims=True, dtype=wide)
        inv_sigma = 1 / np.sqrt(np.var(v, axis=-1, keepdims=True, dtype=wide) + eps)
        if out is None:
            return ((v - mu) * inv_sigma).astype(v.dtype, copy=False), inv_sigma
        if v.dtype == wide:  # the same two roundings as above, into out
            np.multiply(np.subtract(v, mu, out=out), inv_sigma, out=out)
        else:
            out[...] = (v - mu) * inv_sigma
        return out, inv_sigma

    if _threads.shareable(x.value):  # a row's statistics are its own: blocks of rows on ag's op threads
        y = np.empty_like(x.value)
        x2, y2 = x.value.reshape(-1, x.shape[-1]), y.reshape(-1, x.shape[-1])

        def forward_rows(start: int, stop: int) -> None:
            normalized(x2[start:stop], y2[start:stop])
        _threads.in_blocks(forward_rows, len(x2), x2.size, _threads.MIN_PASS)
    else:
        y, _ = normalized(x.value)
    y *= gamma.value
    y += beta.value

    def _backward(out: Tensor, saved: Saved) -> None:
        dy, g_v = out.grad, saved[gamma]
        if _threads.shareable(saved[x], dy):  # x̂ and dx by rows; the sums over rows (dγ, dβ) in one pass each
            x2, dy2 = saved[x].reshape(-1, x.shape[-1]), dy.reshape(-1, x.shape[-1])
            x_hat = np.empty_like(x2)
            dx = np.empty_like(x2) if x.requires_grad else None

            def backward_rows(start: int, stop: int) -> None:
                xh, inv_sigma = normalized(x2[start:stop], x_hat[start:stop])
                if dx is not None:
                    _layer_norm_dx(dy2[start:stop], g_v, xh, inv_sigma, dx[start:stop])
            _threads.in_blocks(backward_rows, len(x2), x2.size, _threads.MIN_PASS)
            x_hat, dx = x_hat.reshape(x.shape), dx.reshape(x.shape) if dx is not None else None
        else:
            x_hat, inv_sigma = normalized(saved[x])
            dx = _layer_norm_dx(dy, g_v, x_hat, inv_sigma) if x.requires_grad else None
        axes = tuple(range(x.ndim - 1))
        if gamma.requires_grad:
            accumulate_grad(gamma, np.sum(dy * x_hat, axis=axes))
        if beta.requires_grad:
            accumulate_grad(beta, np.sum(dy, axis=axes))
        if dx is not None:
            accumulate_grad(x, dx)
    return make_output(y, "layer_norm", (x, gamma, beta), _backward, saves=(x, gamma))


def _layer_norm_dx(dy, gamma, x_hat, inv_sigma, out=None):
    """dx = (g - mean(g) - x̂·mean(g·x̂))/σ with g = dy·γ, row by row, in g's buffer; into ``out``
    (x's dtype) if given."""
    g = dy * gamma
    mean_g, mean_gx = np.mean(g, axis=-1, keepdims=True), np.mean(g * x_hat, axis=-1, keepdims=True)
    g -= mean_g
    g -= x_hat * mean_gx
    if out is None:
        return (g * inv_sigma).astype(x_hat.dtype, copy=False)
    if np.result_type(g, inv_sigma) == out.dtype:
        return np.multiply(g, inv_sigma, out=out)
    out[...] = g * inv_sigma
    return out


# a dropout mask's elements drawn by one generator: this cut, not the workers', fixes the mask
MASK_CHUNK = 1 << 19


def keep_mask(rng: np.random.Generator, shape: tuple[int, ...], p: float) -> np.ndarray:
    """A Bernoulli(1 - p) boolean array of ``shape``, on the host: an element is kept where a
    uniform 32-bit integer is at least p · 2^32, rounded. ``rng`` gives one seed; chunk c of
    ``MASK_CHUNK`` elements is drawn from its own PCG64 seeded with (seed, c), so the chunks are
    shared out on ag's op threads (``random_raw`` lets go of the GIL) and the mask is the same for
    any number of workers. For 2^23 elements on Zen 4, ``rng.random(shape) >= p`` took 25.6 ms,
    this 10.5 on one worker and 8.0 on two."""
    n = math.prod(shape)
    threshold = min(round(p * 2.0 ** 32), 2 ** 32 - 1)
    seed = int(rng.integers(2 ** 63))
    mask = np.empty(n, np.bool_)

    def chunks(first: int, stop: int) -> None:
        for c in range(first, stop):
            start, end = c * MASK_CHUNK, min(n, (c + 1) * MASK_CHUNK)
            raw = np.random.PCG64((seed, c)).random_raw(-(-(end - start) // 2)).view(np.uint32)
            np.greater_equal(raw[:end - start], threshold, out=mask[start:end])
    _threads.in_blocks(chunks, -(-n // MASK_CHUNK), n, _threads.MIN_PASS)
    return mask.reshape(shape)


def dropout(x, p: float, rng: np.random.Generator | None = None, *, mask: np.ndarray | None = None) -> Tensor:
    """y = x ∘ mask / (1 - p) with mask ~ Bernoulli(1 - p), one byte an element;  dx = dy ∘ mask / (1 - p).
    Saves only the boolean mask (in the closure): x itself is not needed. The mask is drawn
    from ``rng`` (``keep_mask``), or given (a boolean array of x's shape). A large one's mask and
    its backward's passes are shared out on ag's op threads."""
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
    y = x.value * mask  # on one thread: two threads faulting in y's new pages took longer than one
    y *= keep

    def _backward(out: Tensor, saved: Saved) -> None:
        g = grad_to_overwrite(out)

        def scaled(g_, mask_) -> None:
            g_ *= mask_
            g_ *= keep
        _threads.elementwise(scaled, g, mask)
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
        # the least score before the mask, less the greatest row max, bounds the shifted scores
        lowest = np.fmin.reduce(y_, axis=None) if type(y_) is np.ndarray and y_.size else None
        if causal:  # a temporary of this pass: held for the whole op, it raised the op's peak
            np.copyto(y_, -np.inf, where=xp.arange(n_k)[None, :] > xp.arange(n_q)[:, None])
        m = _finite_max(y_, (y_.ndim - 1,)).astype(y_.dtype, copy=False)
        y_ -= m
        _exp_flushed(y_, None if lowest is None else lowest - np.max(m))
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
