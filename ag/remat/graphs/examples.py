"""The graphs the lecture plans on: a residual MLP, a U-Net-like net with long skip connections,
and transformer layers. Each builder returns ``(fn, inputs)`` for ``capture(fn, *inputs)``;
``fn`` returns a scalar loss and its parameters require grad."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ... import nn, ops
from ...tensor import Tensor


def residual_mlp(blocks: int = 4, batch: int = 256, width: int = 128, seed: int = 0) -> tuple[Callable, tuple]:
    """h ← h + relu(h W) for each block; loss Σ h²."""
    rng = np.random.default_rng(seed)
    x = Tensor(rng.standard_normal((batch, width)).astype(np.float32), name="x")
    ws = [Tensor((rng.standard_normal((width, width)) * 0.1).astype(np.float32), requires_grad=True, name=f"w{k}")
          for k in range(blocks)]

    def fn(x):
        h = x
        for w in ws:
            h = h + ops.relu(h @ w)
        return ops.sum(h * h)
    fn.parameters = ws
    return fn, (x,)


def unet(batch: int = 256, width: int = 128, seed: int = 0) -> tuple[Callable, tuple]:
    """Down width → width/2 → width/4, up again, each up level adding the down level of its size:
    two long skip connections across the bottleneck, as in a U-Net."""
    rng = np.random.default_rng(seed)
    x = Tensor(rng.standard_normal((batch, width)).astype(np.float32), name="x")
    w, half, quarter = width, width // 2, width // 4
    shapes = [(w, w), (w, half), (half, quarter), (quarter, half), (half, w), (w, w)]
    ws = [Tensor((rng.standard_normal(s) * 0.1).astype(np.float32), requires_grad=True, name=f"w{k}")
          for k, s in enumerate(shapes)]

    def fn(x):
        e1 = ops.relu(x @ ws[0])
        e2 = ops.relu(e1 @ ws[1])
        bottom = ops.tanh(e2 @ ws[2])
        d2 = ops.relu(bottom @ ws[3]) + e2
        d1 = ops.relu(d2 @ ws[4]) + e1
        return ops.sum((d1 @ ws[5]) * d1)
    fn.parameters = ws
    return fn, (x,)


def transformer(layers: int = 2, s: int = 128, b: int = 2, h: int = 64, a: int = 4, *, attention: str = "naive",
                dtype=np.float32, dropout: float = 0.1, seed: int = 3) -> tuple[Callable, tuple]:
    """``layers`` GPT layers (nn.TransformerLayer for one, nn.Transformer for more) on (s, b, h); loss Σ out."""
    options = dict(attention=attention, dtype=dtype, dropout=dropout, seed=seed)
    model = nn.TransformerLayer(h, a, **options) if layers == 1 else nn.Transformer(layers, h, a, **options)
    x = Tensor(np.random.default_rng(1).standard_normal((s, b, h)).astype(dtype), requires_grad=True, name="x")

    def fn(x):
        return ops.sum(model(x))
    fn.parameters = [*model.parameters(), x]
    fn.model = model
    return fn, (x,)
