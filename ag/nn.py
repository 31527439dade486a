"""Layers of a GPT-style transformer, Megatron's layout: activations are (s, b, h).

Every layer is built from ag ops, and each op saves exactly what its backward reads, so
after a ``TransformerLayer``'s forward the engine holds the tensors of Korthikanti et al.
2022 and nothing else (``ag.memory_model.activation_terms`` lists them):

    layernorm1.input   x                         LayerNorm saves its input
    attention.qkv_input, q, k, v                 the QKV linear's input; Q, K, V are views of its output
    softmax_output, its dropout mask, output     the scores themselves are freed
    attention.projection_input                   the heads' output, which the out-projection reads
    attention.dropout_mask                       the residual sum is kept only as layernorm2.input
    mlp.input, gelu_input, gelu_output           the two MLP linears' inputs and GeLU's
    mlp.dropout_mask

Recomputation, NeMo's options: ``activations_checkpoint_granularity="selective"`` wraps the
attention core (QKᵀ, softmax, dropout, ·V) in ``ag.checkpoint``: its inputs Q, K, V
are kept anyway, and the three as²b tensors are recomputed in backward. ``"full"`` wraps
the whole layer: it keeps only its input. ``attention="flash"`` uses
``ag.attention.flash_attention``, which never stores the scores (selective recomputation
built in); NumPy's flash path has no attention dropout, so that dropout is skipped there.

Dropout masks are seeded per (layer seed, forward call, site), so a rerun in backward draws
the same masks as the forward it replays.
"""
from __future__ import annotations

import math
from typing import Callable, Iterator

import numpy as np

from . import memory_model, ops
from .attention import flash_attention
from .checkpoint import checkpoint
from .discard import release_unneeded
from .scopes import scope
from .ops.fused import keep_mask
from .tensor import Tensor

ATTENTION_CORE = "attention core"  # the scopes (scopes.scope) NeMo's modes read in remat.nemo
TRANSFORMER_LAYER = "transformer layer"


class Module:
    """Something with parameters: ``parameters()`` yields them, children's included."""

    def parameters(self) -> Iterator[Tensor]:
        for value in vars(self).values():
            if isinstance(value, Tensor) and value.requires_grad:
                yield value
            elif isinstance(value, Module):
                yield from value.parameters()
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, Module):
                        yield from item.parameters()

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.zero_grad()


def _rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


class Linear(Module):
    """y = x W + b with W of shape (in, out), initialized N(0, 0.02²) as in Megatron."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, dtype=np.float32,
                 seed=None, name: str = "linear") -> None:
        rng = _rng(seed)
        self.weight = Tensor((rng.standard_normal((in_features, out_features)) * 0.02).astype(dtype),
                             requires_grad=True, name=f"{name}.weight")
        self.bias = Tensor(np.zeros(out_features, dtype), requires_grad=True, name=f"{name}.bias") if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return ops.linear(x, self.weight, self.bias)


class LayerNorm(Module):
    """y = (x - μ)/σ · γ + β over the hidden axis; saves only its input."""

    def __init__(self, hidden_size: int, *, eps: float = 1e-5, dtype=np.float32, name: str = "layernorm") -> None:
        self.eps = eps
        self.weight = Tensor(np.ones(hidden_size, dtype), requires_grad=True, name=f"{name}.weight")
        self.bias = Tensor(np.zeros(hidden_size, dtype), requires_grad=True, name=f"{name}.bias")

    def __call__(self, x: Tensor) -> Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)


class Dropout(Module):
    """Zero each element with probability p, scale the rest by 1/(1-p); a 1-byte mask is kept.

    The mask of call ``key`` is drawn from the generator seeded with (seed, key), so the same
    key gives the same mask: a rerun in backward matches its forward.
    """

    def __init__(self, p: float, *, seed: int = 0, shard: Callable[[tuple], tuple] | None = None) -> None:
        if not 0 <= p < 1:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p!r}")
        self.p, self.seed, self.calls, self.shard = p, seed, 0, shard

    def __call__(self, x: Tensor, key: tuple[int, ...] | None = None) -> Tensor:
        if self.p == 0:
            return x
        if key is None:
            key, self.calls = (self.calls,), self.calls + 1
        rng = _rng((self.seed, *key))
        if self.shard is None:
            return ops.dropout(x, self.p, rng)
        # this rank's piece of the mask the whole (unsharded) tensor would get
        full_shape, index = self.shard(x.shape)
        mask = keep_mask(rng, full_shape, self.p)[index].copy()
        return ops.dropout(x, self.p, mask=mask)


class GeLU(Module):
    """y = x/2 · (1 + tanh(√(2/π)(x + 0.044715 x³))); saves its input."""

    def __call__(self, x: Tensor) -> Tensor:
        return ops.gelu(x)


def _check_heads(op: str, hidden_size: int, num_heads: int, num_query_groups) -> int:
    for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads)):
        if not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{op}: {name} must be a positive integer, got {value!r}")
    if hidden_size % num_heads:
        raise ValueError(f"{op}: hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    groups = num_heads if num_query_groups is None else num_query_groups
    if not isinstance(groups, (int, np.integer)) or groups <= 0 or num_heads % groups:
        raise ValueError(f"{op}: num_heads {num_heads} is not divisible by num_query_groups "
                         f"{num_query_groups!r} (None for multi-head, 1 for MQA)")
    return groups


class MultiHeadAttention(Module):
    """Self-attention with ``num_query_groups`` key/value heads (None: one per head; 1: MQA).

    One linear makes Q (h columns, ordered group by group) and K, V (h·g/a columns each);
    Q, K and V are views of its output, so keeping them costs that one buffer.

    ``qkv``, ``proj`` and ``attention_dropout`` are made from ``seed`` unless given: a
    tensor-parallel rank (``ag.parallel``) passes in its shards of them.
    ``recompute_core`` reruns the attention core in backward (selective recomputation).
    """

    def __init__(self, hidden_size: int, num_heads: int, *, num_query_groups: int | None = None,
                 dropout: float = 0.1, attention: str = "naive", causal: bool = True,
                 dtype=np.float32, seed: int = 0, heads: slice | None = None, qkv: Module | None = None,
                 proj: Module | None = None, attention_dropout: Dropout | None = None,
                 recompute_core: bool = False) -> None:
        self.groups = _check_heads("MultiHeadAttention", hidden_size, num_heads, num_query_groups)
        if attention not in ("naive", "flash"):
            raise ValueError(f"MultiHeadAttention: attention must be 'naive' or 'flash', got {attention!r}")
        self.h, self.a, self.d = hidden_size, num_heads, hidden_size // num_heads
        self.attention, self.causal = attention, causal
        if qkv is None:
            qkv = Linear(hidden_size, hidden_size + 2 * self.groups * self.d, dtype=dtype, seed=(seed, 1),
                         name="attention.qkv")
        if proj is None:
            proj = Linear(hidden_size, hidden_size, dtype=dtype, seed=(seed, 2), name="attention.proj")
        if attention_dropout is None:
            attention_dropout = Dropout(dropout, seed=seed * 4 + 1)
        self.qkv, self.proj, self.attention_dropout = qkv, proj, attention_dropout
        self.recompute_core = recompute_core

    def __call__(self, x: Tensor, key: tuple[int, ...] = (0,)) -> Tensor:
        """(s, b, h) → (s, b, h): the heads' output, before the out-projection's dropout."""
        qkv = self.qkv(x)
        s, b, _ = qkv.shape  # with sequence parallelism x is a slice of the sequence, qkv is not
        kv = self.groups * self.d  # columns of K, and of V
        q = self._split_heads(qkv, slice(0, self.h), self.a // self.groups)
        k = self._split_heads(qkv, slice(self.h, self.h + kv), 1)
        v = self._split_heads(qkv, slice(self.h + kv, None), 1)
        core = self._core(key)
        o = checkpoint(core, q, k, v) if self.recompute_core else core(q, k, v)
        # (b, g, G, s, d) → (s, b, h)
        out = self.proj(ops.reshape(ops.transpose(o, (3, 0, 1, 2, 4)), (s, b, self.h)))
        release_unneeded([out], [x])  # the scores QKᵀ go now, before the MLP runs beside them
        return out

    def _split_heads(self, qkv: Tensor, columns: slice, heads_per_group: int) -> Tensor:
        """(s, b, columns) → (b, g, G, s, d): a group's G query heads side by side with its k/v head (G = 1)."""
        s, b, _ = qkv.shape
        heads = ops.reshape(ops.getitem(qkv, (..., columns)), (s, b, self.groups, heads_per_group, self.d))
        return ops.transpose(heads, (1, 2, 3, 0, 4))

    def _core(self, key: tuple[int, ...]) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        """softmax(QKᵀ/√d + mask) with dropout, times V: the part selective recomputation reruns."""
        scale = 1 / math.sqrt(self.d)

        def core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            with scope(ATTENTION_CORE):  # what NeMo's selective recomputation reruns
                if self.attention == "flash":
                    return flash_attention(q, k, v, causal=self.causal, scale=scale)
                p = ops.scaled_masked_softmax(ops.matmul(q, ops.transpose(k, (0, 1, 2, 4, 3))), scale, self.causal)
                return ops.matmul(self.attention_dropout(p, key), v)
        return core


class MLP(Module):
    """h → 4h → GeLU → h."""

    def __init__(self, hidden_size: int, *, dtype=np.float32, seed: int = 0) -> None:
        self.fc1 = Linear(hidden_size, 4 * hidden_size, dtype=dtype, seed=(seed, 3), name="mlp.fc1")
        self.gelu = GeLU()
        self.fc2 = Linear(4 * hidden_size, hidden_size, dtype=dtype, seed=(seed, 4), name="mlp.fc2")

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc2(self.gelu(self.fc1(x)))


class LayerRun(Module):
    """How a transformer layer runs, whatever it holds: ``forward_with(key)`` is its forward with
    the dropout masks of call ``key``; ``granularity == "full"`` reruns it in backward."""

    hidden_size: int
    granularity: str | None
    calls: int

    def forward_with(self, key: tuple[int, ...]) -> Callable[[Tensor], Tensor]:
        raise NotImplementedError

    def next_key(self) -> tuple[int, ...]:
        """A fresh dropout key for each forward call (a rerun reuses its call's key)."""
        key, self.calls = (self.calls,), self.calls + 1
        return key

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"{type(self).__name__}: expected input of shape (s, b, {self.hidden_size}), "
                             f"got {x.shape}")
        forward = self.forward_with(self.next_key())
        if self.granularity == "full":
            return checkpoint(forward, x)
        out = forward(x)
        release_unneeded([out], [x])  # scores, projection outputs, the final residual sum
        return out


class TransformerLayer(LayerRun):
    """Pre-LN GPT layer on (s, b, h):  y = x + drop(attn(ln1(x))),  out = y + drop(mlp(ln2(y))).

    ``activations_checkpoint_granularity``: None keeps every activation backward reads,
    sbh(34 + 5as/h) bytes in 16-bit; "selective" recomputes the attention core, 34sbh;
    "full" keeps only the input, 2sbh, and reruns the layer in backward.
    """

    def __init__(self, hidden_size: int, num_heads: int, *, num_query_groups: int | None = None,
                 dropout: float = 0.1, attention: str = "naive", activations_checkpoint_granularity=None,
                 causal: bool = True, dtype=np.float32, seed: int | None = None) -> None:
        if activations_checkpoint_granularity not in memory_model.RECOMPUTE:
            raise ValueError(f"TransformerLayer: activations_checkpoint_granularity must be None, "
                             f"'selective' or 'full', got {activations_checkpoint_granularity!r}")
        seed = 0 if seed is None else seed
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.granularity, self.seed, self.calls = activations_checkpoint_granularity, seed, 0
        self.ln1 = LayerNorm(hidden_size, dtype=dtype, name="layernorm1")
        selective = activations_checkpoint_granularity == "selective"
        self.attention = MultiHeadAttention(hidden_size, num_heads, num_query_groups=num_query_groups,
                                            dropout=dropout, attention=attention, causal=causal, dtype=dtype,
                                            seed=seed, recompute_core=selective)
        self.attention_dropout = Dropout(dropout, seed=seed * 4 + 2)
        self.ln2 = LayerNorm(hidden_size, dtype=dtype, name="layernorm2")
        self.mlp = MLP(hidden_size, dtype=dtype, seed=seed)
        self.mlp_dropout = Dropout(dropout, seed=seed * 4 + 3)

    def forward_with(self, key: tuple[int, ...]) -> Callable[[Tensor], Tensor]:
        """The layer's forward with its dropout masks fixed by ``key``: the same masks every run."""
        def forward(x: Tensor) -> Tensor:
            with scope(TRANSFORMER_LAYER):  # what NeMo's full recomputation reruns
                y = x + self.attention_dropout(self.attention(self.ln1(x), key), key)
                return y + self.mlp_dropout(self.mlp(self.ln2(y)), key)
        return forward


class Transformer(Module):
    """A stack of ``num_layers`` TransformerLayers, with NeMo's recomputation options.

    ``activations_checkpoint_granularity="full"`` with ``activations_checkpoint_method``:
    "uniform" checkpoints the input of every chunk of ``activations_checkpoint_num_layers``
    layers and reruns the chunk in backward; "block" reruns each of the first
    ``activations_checkpoint_num_layers`` layers on its own and stores the rest whole.
    "selective" recomputes every layer's attention core.
    """

    def __init__(self, num_layers: int, hidden_size: int, num_heads: int, *,
                 activations_checkpoint_granularity=None, activations_checkpoint_method: str = "uniform",
                 activations_checkpoint_num_layers: int = 1, seed: int | None = None, **layer_options) -> None:
        if activations_checkpoint_method not in memory_model.METHODS:
            raise ValueError(f"Transformer: activations_checkpoint_method must be 'uniform' or 'block', "
                             f"got {activations_checkpoint_method!r}")
        n = activations_checkpoint_num_layers
        if not isinstance(n, (int, np.integer)) or not 1 <= n <= num_layers:
            raise ValueError(f"Transformer: activations_checkpoint_num_layers must be in 1..{num_layers}, "
                             f"got {n!r}")
        seed = 0 if seed is None else seed
        selective = "selective" if activations_checkpoint_granularity == "selective" else None
        self.layers = [TransformerLayer(hidden_size, num_heads, activations_checkpoint_granularity=selective,
                                        seed=seed * 1000 + i, **layer_options) for i in range(num_layers)]
        self.granularity = activations_checkpoint_granularity
        self.method, self.num_checkpointed = activations_checkpoint_method, n

    def chunks(self) -> list[tuple[list[TransformerLayer], bool]]:
        """The layers in runs, each run with whether it is rerun in backward."""
        L, n = len(self.layers), self.num_checkpointed
        if self.granularity != "full":
            return [(self.layers, False)]
        if self.method == "uniform":
            return [(self.layers[i:i + n], True) for i in range(0, L, n)]
        return [([layer], True) for layer in self.layers[:n]] + ([(self.layers[n:], False)] if n < L else [])

    def __call__(self, x: Tensor) -> Tensor:
        for layers, rerun in self.chunks():
            if rerun:
                forwards = [layer.forward_with(layer.next_key()) for layer in layers]
                x = checkpoint(lambda h, fs=forwards: _run(fs, h), x)
            else:
                for layer in layers:
                    x = layer(x)
        return x


def _run(forwards: list[Callable[[Tensor], Tensor]], x: Tensor) -> Tensor:
    for forward in forwards:
        x = forward(x)
    return x
