"""ZeRO (Rajbhandari et al. 2020): data parallelism without the replicas' redundant model states.

N_d ranks train one model, each on its 1/N_d of the batch. Plain data parallelism (stage 0) keeps
on every rank all the parameters, all the gradients and all of Adam's state. ZeRO partitions them:
rank r owns the r-th 1/N_d of each layer's flat weight, and only the owner steps it.

    stage 0   all-reduce the grads; Adam steps every weight
    stage 1   reduce-scatter the grads after backward (each rank gets the sum of its shard);
              Adam steps the shard; all-gather the stepped shards into the weights
    stage 2   the same, but each layer's grad is reduce-scattered as soon as backward makes it,
              and the full grad freed: only the grad shards outlive backward
    stage 3   the weights too live only as shards: each is all-gathered just before its forward
              and again before its backward (its rematerializer), and discarded after

Bytes a rank (``memory_model.zero_bytes_per_rank``; float32 Adam keeps 4 + 4 + 8 bytes a parameter):
4Ψ + 4Ψ + 8Ψ/N_d, 4Ψ + 12Ψ/N_d, 16Ψ/N_d for stages 1, 2, 3. With ``--precision float16`` (or bfloat16)
the weights and grads are 16-bit and ``amp.MixedPrecision`` steps a float32 master copy of each shard:
2 + 2 + 12 bytes a parameter, the paper's 4Ψ + 12Ψ/N_d, 2Ψ + 14Ψ/N_d, 16Ψ/N_d (its Figure 1).

The model is a stack of L layers y = tanh(x W), W (h × h), with loss Σ(y − target)²/B.
``mpiexec -n N python -m ag.parallel.zero`` prints each rank's measured bytes beside the formula.
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Iterator

import numpy as np

from .. import amp, hooks, memory_model, ops, optim, trace
from ..optim import Adam
from ..tables import table
from ..tensor import Tensor
from . import held
from .mpi import Group

STAGES = memory_model.ZERO_STAGES
PRECISIONS = ("float32", "float16", "bfloat16")


class Sharded:
    """One parameter under ZeRO: ``param`` is the model's Tensor, ``shard`` the leaf the optimizer steps,
    rank r's elements r·n .. (r+1)·n of its flat values, n = size/N_d (stage 0: the parameter itself).

    In stages 1 and 2 the shard is a view of the parameter, so stepping it steps the parameter's own slice.
    In stage 3 the parameter keeps no value: its rematerializer all-gathers it from the ranks' shards for
    each op that reads it (forward, and backward's steps), and the engine discards it after.
    """

    def __init__(self, param: Tensor, group: Group, stage: int) -> None:
        if param.size % group.size:
            raise ValueError(f"ZeRO: {param.describe()} has {param.size} values, which do not split into "
                             f"{group.size} equal shards; expected a size divisible by the ranks")
        n = param.size // group.size
        mine = slice(group.rank * n, (group.rank + 1) * n)
        self.param, self.group, self.stage = param, group, stage
        if stage == 0:
            self.shard = param
        elif stage < 3:
            self.shard = Tensor(param.value.reshape(-1)[mine], requires_grad=True, name=f"{param.name}.shard")
        else:
            self.shard = Tensor(param.value.reshape(-1)[mine].copy(), requires_grad=True, name=f"{param.name}.shard")
            param.rematerializer = self.gather
            param.value = None  # from now on it exists only while an op reads it

    def gather(self) -> np.ndarray:
        """The parameter, all-gathered from the ranks' shards (stage 3)."""
        return self.group.all_gather(self.shard.value).reshape(self.param.shape)

    def reduce_grad(self) -> None:
        """Sum the grad over the ranks: whole (stage 0), or as this rank's shard of the sum (stages ≥ 1)."""
        grad = self.param.grad
        if self.stage == 0 and grad.dtype == np.float32:
            self.group.all_reduce_in_place(grad)
        elif self.stage == 0:  # MPI has no 16-bit sum: a float32 temporary, then 16 bits again
            self.param.grad = self.group.all_reduce(grad)
        elif self.shard.grad is not None:
            raise ValueError(f"ZeRO: {self.param.describe()} got a second grad after its first was reduce-scattered; "
                             "stages 2 and 3 expect each parameter read once a forward")
        else:
            self.shard.grad = self.group.reduce_scatter(grad.reshape(-1))
            self.param.grad = None
            trace.watch_grad(self.shard)

    def gather_stepped(self) -> None:
        """Stages 1 and 2: every rank's stepped shard, all-gathered into the parameter in place."""
        if self.stage in (1, 2):
            self.group.all_gather_in_place(self.param.value.reshape(-1))


class ZeroLayer(Sharded):
    """One layer y = tanh(x W), its weight W sharded for ``stage``."""

    def __init__(self, weight: np.ndarray, group: Group, stage: int) -> None:
        super().__init__(Tensor(weight.copy(), requires_grad=True), group, stage)
        self.weight = self.param

    def __call__(self, x: Tensor) -> Tensor:
        return ops.tanh(ops.matmul(x, self.weight))  # stage 3: the op gathers W, and discards it after


def shard_parameters(params: list[Tensor], group: Group, stage: int) -> list[Sharded]:
    """Every parameter of a model sharded for ``stage`` over ``group``'s ranks."""
    check_stage(group.size, stage)
    return [Sharded(p, group, stage) for p in params]


@contextmanager
def reducing_as_made(sharded: list[Sharded]) -> Iterator[None]:
    """Stages 2 and 3 inside the block: after each backward step, reduce-scatter every grad that step made
    and free it, so only shards outlive backward (each parameter read once a forward, so its grad is whole)."""
    def reduce_new_grads(*_) -> None:
        for s in sharded:
            if s.param.grad is not None:
                s.reduce_grad()
                trace.record("backward", "reduce-scatter", s.param.name)  # the step's snapshot came before it
    if sharded and sharded[0].stage >= 2:
        with hooks.subscribed("step done", reduce_new_grads):
            yield
    else:
        yield


class ZeroOptimizer:
    """ZeRO's step over sharded parameters: sum the grads backward did not (stages 0 and 1), step the
    shards with ``inner`` (``Adam``, or ``amp.MixedPrecision`` on float32 master shards), free the grads,
    and all-gather the stepped shards into the parameters (stages 1 and 2)."""

    def __init__(self, sharded: list[Sharded], inner) -> None:
        self.sharded, self.inner = sharded, inner

    def step(self) -> None:
        for s in self.sharded:
            if s.stage < 2 and s.param.grad is not None:
                s.reduce_grad()
        self.inner.step()
        self.inner.zero_grad()
        for s in self.sharded:
            s.gather_stepped()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none)
        optim.zero_grads([s.param for s in self.sharded], set_to_none)


def build(group: Group, stage: int, num_layers: int, h: int, seed: int = 0,
          precision: str = "float32") -> list[ZeroLayer]:
    """The stack every rank builds from the same seed, W_i ~ N(0, 1/h) in ``precision``, split for ``stage``."""
    check_stage(group.size, stage, h)
    return [ZeroLayer(w, group, stage) for w in initial_weights(num_layers, h, precision, seed)]


def initial_weights(num_layers: int, h: int, precision: str, seed: int = 0) -> list[np.ndarray]:
    """W_i ~ N(0, 1/h), drawn in float32 and rounded to ``precision``."""
    rng = np.random.default_rng(seed)
    weights = [(rng.standard_normal((h, h)) / np.sqrt(h)).astype(np.float32) for _ in range(num_layers)]
    return [w.astype(dtype_of(precision)) for w in weights]


def dtype_of(precision: str) -> np.dtype:
    """float32, or the 16-bit compute dtype ``amp`` names."""
    if precision not in PRECISIONS:
        raise ValueError(f"ZeRO: precision={precision!r}; expected one of {PRECISIONS}")
    return np.dtype(np.float32) if precision == "float32" else amp.compute_dtype(precision)


def make_optimizer(layers: list[ZeroLayer], lr: float):
    """Adam on this rank's shards: directly in float32, or on float32 master copies of 16-bit shards."""
    shards = [layer.shard for layer in layers]
    if shards[0].dtype == np.float32:
        return Adam(shards, lr=lr)
    return amp.MixedPrecision(shards, Adam, lr=lr)


def check_stage(ranks: int, stage: int, h: int | None = None) -> None:
    """ZeRO needs a stage in 0..3, at least two ranks to share the states, and h² divisible by the ranks."""
    if stage not in STAGES:
        raise ValueError(f"ZeRO: stage={stage!r}; expected one of {STAGES} (0 is plain data parallelism)")
    if stage and ranks < 2:
        raise ValueError(f"ZeRO stage {stage} on 1 rank: there is no other rank to share the optimizer state "
                         "with; expected mpiexec -n N with N >= 2 (or stage 0)")
    if h is not None and (h * h) % ranks:
        raise ValueError(f"ZeRO: a weight of {h}x{h} = {h * h} values does not split into {ranks} equal shards; "
                         f"expected h*h % {ranks} == 0")


def batch(step: int, size: int, h: int, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of ``step``, the same on every rank: inputs and targets, (size, h) in ``dtype``."""
    rng = np.random.default_rng(1000 + step)
    return (rng.standard_normal((size, h)).astype(np.float32).astype(dtype),
            np.tanh(rng.standard_normal((size, h))).astype(np.float32).astype(dtype))


def forward_backward(layers: list[ZeroLayer], x: np.ndarray, target: np.ndarray, global_batch: int,
                     on_grad=None) -> float:
    """Loss Σ(y − target)²/B on this micro-batch, and its grads, one layer at a time from the last:
    ``on_grad(layer)`` runs as soon as that layer's W.grad is complete (stage 2 reduce-scatters it there)."""
    inputs, outputs, h = [], [], Tensor(x)
    for i, layer in enumerate(layers):
        a = Tensor(h.value, requires_grad=i > 0)  # the boundary: backward stops here and hands a.grad on
        inputs.append(a)
        h = layer(a)
        outputs.append(h)
    y = Tensor(h.value, requires_grad=True)
    diff = y - Tensor(target)
    loss = ops.sum(diff * diff) * (1.0 / global_batch)
    loss.backward()
    grad = y.grad
    for layer, a, out in zip(reversed(layers), reversed(inputs), reversed(outputs)):
        out.backward(grad)
        grad = a.grad
        if on_grad is not None:
            on_grad(layer)
    return loss.item()


def my_rows(group: Group, global_batch: int) -> slice:
    """This rank's 1/N_d of the batch's rows."""
    return slice(group.rank * global_batch // group.size, (group.rank + 1) * global_batch // group.size)


def reduce_on_the_fly(stage: int):
    """What ``forward_backward`` runs as each layer's grad is made: stages 2 and 3 reduce-scatter it there."""
    return ZeroLayer.reduce_grad if stage >= 2 else None


def optimizer_step(layers: list[ZeroLayer], optimizer: Adam | amp.MixedPrecision) -> None:
    """ZeRO's step (``ZeroOptimizer``) over the layers' sharded weights."""
    ZeroOptimizer(layers, optimizer).step()


def train_step(layers: list[ZeroLayer], optimizer: Adam | amp.MixedPrecision, group: Group, step: int,
               global_batch: int) -> float:
    """One ZeRO step on this rank's 1/N_d of the batch; returns the loss summed over the ranks."""
    x, target = batch(step, global_batch, layers[0].weight.shape[0], layers[0].shard.dtype)
    rows = my_rows(group, global_batch)
    loss = forward_backward(layers, x[rows], target[rows], global_batch, reduce_on_the_fly(layers[0].stage))
    optimizer_step(layers, optimizer)
    return group.comm.allreduce(loss)


def one_process(num_layers: int, h: int, ranks: int, steps: int, global_batch: int, lr: float,
                precision: str = "float32") -> list[np.ndarray]:
    """The reference: one process runs each rank's micro-batch in turn, sums the grads in rank order
    (g_0 + g_1 + ..., in float32 as MPI sums 16-bit grads) and steps Adam on whole weights (on float32
    master copies of 16-bit weights). Returns the weights after ``steps`` steps."""
    weights = [Tensor(w, requires_grad=True) for w in initial_weights(num_layers, h, precision)]
    layers = [_Whole(w) for w in weights]
    optimizer = make_optimizer([SimpleNamespace(shard=w) for w in weights], lr)
    for step in range(steps):
        x, target = batch(step, global_batch, h, weights[0].dtype)
        sums = [None] * num_layers
        for r in range(ranks):
            rows = slice(r * global_batch // ranks, (r + 1) * global_batch // ranks)
            forward_backward(layers, x[rows], target[rows], global_batch)
            for i, w in enumerate(weights):
                grad = w.grad.astype(np.promote_types(w.dtype, np.float32), copy=False)
                sums[i] = grad if sums[i] is None else sums[i] + grad
                w.grad = None
        for w, g in zip(weights, sums):
            w.grad = g.astype(w.dtype, copy=False)
        optimizer.step()
        optimizer.zero_grad()
    return [w.value for w in weights]


class _Whole:
    """A layer of the one-process reference: y = tanh(x W) with W whole."""

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight

    def __call__(self, x: Tensor) -> Tensor:
        return ops.tanh(ops.matmul(x, self.weight))


def measure(group: Group, stage: int, num_layers: int, h: int, global_batch: int, precision: str = "float32") -> dict:
    """This rank's bytes by category, from tracemalloc, and the formula (float32 Adam's 4 + 4 + 8 bytes a
    parameter, mixed precision's 2 + 2 + 12): params after building, grads held after backward, optimizer
    state (with the float32 master copies) after the first step."""
    batch(0, 1, 1)  # NumPy keeps a few bytes from its first random generator: let them be made before counting
    with held.counting():
        start = held.numpy_bytes()
        layers = build(group, stage, num_layers, h, precision=precision)
        built = held.numpy_bytes()
        optimizer = make_optimizer(layers, lr=1e-3)
        masters = held.numpy_bytes() - built
        x, target = batch(0, global_batch, h, layers[0].shard.dtype)
        rows = my_rows(group, global_batch)
        x, target = x[rows].copy(), target[rows].copy()
        before_backward = held.numpy_bytes()
        forward_backward(layers, x, target, global_batch, reduce_on_the_fly(stage))
        grads = held.numpy_bytes() - before_backward
        optimizer_step(layers, optimizer)
        state = held.numpy_bytes() - before_backward + masters
    psi = num_layers * h * h
    per_parameter = memory_model.FLOAT32_ADAM if precision == "float32" else memory_model.MIXED_PRECISION_ADAM
    formula = memory_model.zero_bytes_per_rank(psi, group.size, stage, bytes_per_parameter=per_parameter)
    measured = {"params": built - start, "grads": grads, "optimizer_state": state}
    return {"rank": group.rank, "stage": stage, "psi": psi, "measured": measured, "formula": formula}


def main(argv: list[str] | None = None) -> int:
    """``mpiexec -n N python -m ag.parallel.zero``: each rank's params, grads and Adam state, measured,
    beside the formula; ``--check K``: the weights after K steps against one process's."""
    parser = argparse.ArgumentParser(prog="python -m ag.parallel.zero", description=main.__doc__)
    parser.add_argument("--check", type=int, metavar="K", help="steps to train and compare with one process")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--stages", type=int, nargs="+", default=list(STAGES))
    parser.add_argument("--precision", choices=PRECISIONS, default="float32",
                        help="16-bit weights and grads with float32 master copies (amp.MixedPrecision)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on rank 0")
    args = parser.parse_args(argv)
    group = Group()
    rows = [_row(group, stage, args) for stage in args.stages]
    if group.rank == 0:
        if args.json:
            print(json.dumps({"ranks": group.size, "precision": args.precision, "rows": rows}))
        else:
            _print_rows(group.size, rows, args.check, args.precision)
    return 0


def _row(group: Group, stage: int, args) -> dict:
    if args.check:
        layers = build(group, stage, args.layers, args.hidden, precision=args.precision)
        optimizer = make_optimizer(layers, lr=1e-2)
        losses = [train_step(layers, optimizer, group, k, args.batch) for k in range(args.check)]
        mine = [layer.gather() if stage == 3 else layer.weight.value for layer in layers]
        want = one_process(args.layers, args.hidden, group.size, args.check, args.batch, 1e-2, args.precision)
        worst = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) for a, b in zip(mine, want))
        identical = all(np.array_equal(a, b) for a, b in zip(mine, want))
        identical = bool(group.comm.allreduce(int(identical), op=group.MPI.MIN))
        return dict(stage=stage, steps=args.check, losses=losses, identical=identical,
                    max_abs_difference=group.comm.allreduce(worst, op=group.MPI.MAX))
    every = group.comm.gather(measure(group, stage, args.layers, args.hidden, args.batch, args.precision), root=0)
    return dict(stage=stage, psi=every[0]["psi"] if every else None, formula=every[0]["formula"] if every else None,
                measured=[r["measured"] for r in every] if every else None)


def _print_rows(n: int, rows: list[dict], check, precision: str) -> None:
    if check:
        print(f"weights after {check} Adam steps on {n} ranks against one process ({precision})")
        table(["stage", "bit-identical", "max |Δθ|", "loss, first → last"],
              [[r["stage"], r["identical"], f"{r['max_abs_difference']:.1e}",
                f"{r['losses'][0]:.4f} → {r['losses'][-1]:.4f}"] for r in rows])
        return
    split = "4 + 4 + 8" if precision == "float32" else "2 + 2 + 12"
    print(f"bytes a rank on {n} ranks ({precision} Adam: {split} bytes a parameter), measured with tracemalloc")
    cells = []
    for r in rows:
        for category in ("params", "grads", "optimizer_state"):
            cells.append([r["stage"], category, r["formula"][category],
                          " ".join(str(m[category]) for m in r["measured"])])
    table(["stage", "category", "formula B", "measured B (per rank)"], cells)


if __name__ == "__main__":
    sys.exit(main())
