"""The whole memory wall (Sohoni et al. 2019): one training step of a GPT-like model measured by
category, each slice beside its formula, and the levers that cut them.

The model: a token embedding (v, h) and L ``nn.TransformerLayer``s of (s, b, h, a), dropout 0.1,
trained with Adam on loss = mean(output). With Ψ parameters and w bytes a value (4 or 2):

    parameters        wΨ
    gradients         wΨ                             the parameters' grads, after backward
    optimizer state   8Ψ (m, v)  or 12Ψ mixed        (float32 master, m, v), ZeRO's accounting
    activations       L·F + (sbh + 1)·w              what the forward leaves for backward: F a layer's
                                                     sbh(34 + 5as/h) (Korthikanti et al. 2022) with its
                                                     values at w bytes, and the stack's output and loss

A ``Lever`` changes how the step runs, and so both the measurement and the formula: mixed
precision, ZeRO's stages 1-3 (the model states of ``memory_model.zero_bytes_per_rank``), selective and
full recomputation, flash attention, and offloading full recomputation's checkpoints to disk (then the
activations are the output and the loss, (sbh + 1)·w). Another lever is one more ``Lever`` that returns
a changed ``WallConfig``.

ZeRO's bars measure rank 0 of N_d in one process (``parallel.mpi.StandIn``): its collectives allocate
what MPI's would, but its peers are absent, so its bytes are a rank's and its sums are not the group's.
"""
from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

import numpy as np

from . import amp, memory_model, nn, offload, ops, optim, remat, trace
from .parallel import zero
from .parallel.mpi import StandIn
from .tensor import Tensor

SLICES = ("parameters", "gradients", "optimizer state", "activations")


@dataclass(frozen=True)
class WallConfig:
    """One training step's shape and settings: what a lever changes."""

    num_layers: int
    hidden: int
    heads: int
    seq: int
    batch: int
    vocab: int = 64
    dtype: str = "float32"
    granularity: str | None = None  # NeMo's activations_checkpoint_granularity: None, "selective", "full"
    attention: str = "naive"
    zero_stage: int = 0  # ZeRO's stage, on rank 0 of ``ranks``
    ranks: int = 1
    offload: bool = False  # full recomputation's checkpoints written to disk and read back for backward

    @property
    def value_bytes(self) -> int:
        return np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Lever:
    """A named change to the step, e.g. ``Lever("mixed precision", lambda c: replace(c, dtype="float16"))``."""

    name: str
    apply: Callable[[WallConfig], WallConfig]


LEVERS = {
    "mixed precision": Lever("mixed precision", lambda c: replace(c, dtype="float16")),
    "selective recomputation": Lever("selective recomputation", lambda c: replace(c, granularity="selective")),
    "full recomputation": Lever("full recomputation", lambda c: replace(c, granularity="full")),
    "flash attention": Lever("flash attention", lambda c: replace(c, attention="flash")),
    **{f"ZeRO-{k}": Lever(f"ZeRO-{k}", lambda c, k=k: replace(c, zero_stage=k, ranks=2)) for k in (1, 2, 3)},
    "offloading": Lever("offloading", lambda c: replace(c, granularity="full", offload=True)),
}


@dataclass
class WallBar:
    """One bar of the wall: the bytes of each slice measured and predicted, and the step's measured peak."""

    config: WallConfig
    levers: tuple[str, ...]
    measured: dict[str, int]
    predicted: dict[str, int]
    peak_bytes: int
    parameters: int

    @property
    def label(self) -> str:
        c = self.config
        return f"L={c.num_layers} h={c.hidden} s={c.seq} b={c.batch}" + "".join(f" +{n}" for n in self.levers)

    @property
    def short_label(self) -> str:
        """The label in lines for a bar's foot: "L=2", "h=48", "b=4", then "+mixed" for each lever."""
        c = self.config
        return "\n".join([f"L={c.num_layers}", f"h={c.hidden}", f"b={c.batch}", *(f"+{n.split()[0]}" for n in self.levers)])


def parameter_count(c: WallConfig) -> int:
    """Ψ = vh + L(12h² + 13h): the embedding, and per layer QKV, out-projection, MLP (4h) and two LayerNorms."""
    return c.vocab * c.hidden + c.num_layers * (12 * c.hidden ** 2 + 13 * c.hidden)


def predict(c: WallConfig) -> dict[str, int]:
    """The formulas of the module docstring for ``c``, by slice."""
    psi, w = parameter_count(c), c.value_bytes
    states = memory_model.zero_bytes_per_rank(psi, c.ranks, c.zero_stage, bytes_per_parameter=(w, w, 8 if w == 4 else 12))
    layers = 0 if c.offload else c.num_layers * layer_activation_bytes(c)
    return {"parameters": states["params"], "gradients": states["grads"], "optimizer state": states["optimizer_state"],
            "activations": layers + (c.seq * c.batch * c.hidden + 1) * w}


def layer_activation_bytes(c: WallConfig) -> int:
    """F: ``memory_model``'s terms with values at w bytes (masks stay 1 byte); flash attention keeps
    selective's tensors and its logsumexp, one float32 per head and token (4asb), unless selective
    recomputation reruns the attention core, logsumexp and all."""
    recompute = "selective" if c.attention == "flash" and c.granularity is None else c.granularity
    terms = memory_model.activation_terms(c.seq, c.batch, c.hidden, c.heads, recompute=recompute,
                                          bytes_per_value=c.value_bytes)
    logsumexp = 4 * c.heads * c.seq * c.batch if c.attention == "flash" and c.granularity is None else 0
    return sum(terms.values()) + logsumexp


def measure(c: WallConfig, seed: int = 0) -> tuple[dict[str, int], int]:
    """Run two steps, model and optimizer made inside the timeline; the second step's slices and its
    peak (the most bytes alive after any op or step, every slice counted).

    Parameters and optimizer state as the step ends, gradients after backward, activations after the
    forward (everything it left alive but the other slices: tensors kept and dropout masks)."""
    dtype = np.dtype(c.dtype) if c.dtype == "float32" else amp.compute_dtype(c.dtype)
    tokens = np.random.default_rng(seed).integers(0, c.vocab, (c.seq, c.batch))
    with trace.tracing() as timeline, tempfile.TemporaryDirectory(prefix="ag-wall-") as directory:
        model = _GPT(c, dtype, seed, directory if c.offload else None)
        sharded = zero.shard_parameters(list(model.parameters()), StandIn(c.ranks), c.zero_stage)
        shards = [s.shard for s in sharded]
        opt = zero.ZeroOptimizer(sharded, optim.Adam(shards) if c.dtype == "float32" else amp.MixedPrecision(shards))
        _step(model, tokens, opt, timeline, sharded)
        start = len(timeline)
        after_forward, after_backward = _step(model, tokens, opt, timeline, sharded)
    end, forward = timeline[-1].categories, timeline[after_forward].categories
    held = forward["parameters"] + forward["optimizer state"] + forward["gradients"] + forward["inputs"]
    measured = {"parameters": end["parameters"], "gradients": timeline[after_backward].categories["gradients"],
                "optimizer state": end["optimizer state"],
                "activations": timeline[after_forward].allocated_bytes - held}
    return measured, max(s.allocated_bytes for s in timeline[start:])


class _GPT(nn.Module):
    """The embedding and the transformer; with ``offload_to`` a folder, the embedding's output and each
    rerun chunk's output but the last are written there by an ``offload.Offloader`` (one each step)."""

    def __init__(self, c: WallConfig, dtype, seed: int, offload_to: str | None = None) -> None:
        rng = np.random.default_rng((seed, 0))
        self.embedding = Tensor((rng.standard_normal((c.vocab, c.hidden)) * 0.02).astype(dtype),
                                requires_grad=True, name="embedding")
        self.body = nn.Transformer(c.num_layers, c.hidden, c.heads, dtype=dtype, seed=seed, attention=c.attention,
                                   activations_checkpoint_granularity=c.granularity)
        self.offload_to, self.offloader = offload_to, None

    def __call__(self, tokens: np.ndarray) -> Tensor:
        if self.offloader is None:
            return self.body(ops.getitem(self.embedding, tokens))
        chain = [lambda t: ops.getitem(self.embedding, t.value)]
        chain += [_chunk(layers, rerun) for layers, rerun in self.body.chunks()]
        return offload.offloaded(chain, Tensor(tokens), self.offloader)

    @contextlib.contextmanager
    def offloading(self) -> Iterator[None]:
        """A fresh Offloader for one step's forward and backward (none without ``offload_to``)."""
        if self.offload_to is None:
            yield
            return
        self.offloader = offload.Offloader(self.offload_to)
        try:
            yield
        finally:
            self.offloader.close()
            self.offloader = None


def _chunk(layers: list[nn.TransformerLayer], rerun: bool) -> Callable[[Tensor], Tensor]:
    """A run of layers as ``nn.Transformer`` calls it: checkpointed (its input kept, the run redone in backward)."""
    def run(x: Tensor) -> Tensor:
        forwards = [layer.forward_with(layer.next_key()) for layer in layers]
        through = lambda h: _through(forwards, h)  # noqa: E731
        return remat.checkpoint(through, x) if rerun else through(x)
    return run


def _through(forwards: list[Callable[[Tensor], Tensor]], x: Tensor) -> Tensor:
    for forward in forwards:
        x = forward(x)
    return x


def _step(model: _GPT, tokens: np.ndarray, opt, timeline: list, sharded: list) -> tuple[int, int]:
    """One training step; the indices of the snapshots after its forward and after its backward
    (ZeRO-2 and -3 reduce-scatter each grad as backward makes it)."""
    with model.offloading():
        loss = ops.mean(model(tokens))
        after_forward = len(timeline) - 1
        with zero.reducing_as_made(sharded):
            loss.backward()
        after_backward = len(timeline) - 1
    opt.step()
    opt.zero_grad()
    return after_forward, after_backward


SIZES = ((1, 32, 2), (2, 48, 4), (3, 64, 4))  # (L, h, a) of ``ag demo wall``: small enough for 2 cores


def wall(sizes: Sequence[tuple[int, int, int]] = SIZES,
         batches: Sequence[int] = (1, 4), seq: int = 64, levers: Sequence[str | Lever] = ("mixed precision",),
         seed: int = 0) -> list[WallBar]:
    """Every (L, h, a) in ``sizes`` at every batch in ``batches``, first as is, then with each lever
    added in turn (each on top of the ones before), measured and predicted."""
    bars = []
    for num_layers, hidden, heads in sizes:
        for batch in batches:
            config, applied = WallConfig(num_layers, hidden, heads, seq, batch), ()
            bars.append(_bar(config, applied, seed))
            for lever in map(_lever, levers):
                config, applied = lever.apply(config), (*applied, lever.name)
                bars.append(_bar(config, applied, seed))
    return bars


def _lever(lever: str | Lever) -> Lever:
    if isinstance(lever, Lever):
        return lever
    if lever not in LEVERS:
        raise ValueError(f"wall: unknown lever {lever!r}; expected one of {sorted(LEVERS)} or an ag.wall.Lever")
    return LEVERS[lever]


def _bar(config: WallConfig, levers: tuple[str, ...], seed: int) -> WallBar:
    measured, peak = measure(config, seed)
    return WallBar(config, levers, measured, predict(config), peak, parameter_count(config))
