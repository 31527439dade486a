"""Tensor and sequence parallelism over real MPI processes, Megatron-LM's way.

t ranks share one transformer layer. Tensor parallelism (Shoeybi et al. 2019) splits the
attention heads and the MLP's 4h columns: the QKV and first MLP linears are column-parallel
(each rank computes its heads / columns), the out-projection and second MLP linear are
row-parallel (each rank a partial sum, then summed across ranks). Between them sit two
conjugate operators:

    f: identity forward, all-reduce backward      (before a column-parallel linear)
    g: all-reduce forward, identity backward      (after a row-parallel linear)

Everything outside those regions (layer norms, dropouts, residuals) is replicated, so it
costs sbh(10 + 24/t + 5as/(ht)) bytes a rank. Sequence parallelism (Korthikanti et al.
2022) splits those regions along the sequence instead, replacing the pair with

    g:  all-gather along s forward, reduce-scatter backward   (into a tensor-parallel region)
    ḡ:  reduce-scatter along s forward, all-gather backward   (out of it)

so that every activation is divided by t: sbh/t · (34 + 5as/h). The column-parallel
linears keep only their sequence-sharded input and all-gather it again in backward.

Run it with ``mpiexec -n 2 ag demo parallel``; ``python -m ag.parallel --check`` under
mpiexec compares every rank's gradients with one process's layer.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

import numpy as np

from .. import memory_model, nn, ops, trace
from ..tables import table
from ..tensor import Grads, Saved, Tensor, make_output
from .mpi import Group


# ---- the conjugate operators, as ag ops ----

def copy_to_tensor_region(x: Tensor, group: Group) -> Tensor:
    """f: y = x;  dx = Σ_ranks dy (each rank's heads contributed part of x's gradient)."""
    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (group.all_reduce(out.grad),)
    return make_output(x.value, "copy_to_tensor_region", (x,), _backward, call=(copy_to_tensor_region, x, group))


def reduce_from_tensor_region(x: Tensor, group: Group) -> Tensor:
    """g: y = Σ_ranks x (the row-parallel partial sums);  dx = dy."""
    value = group.all_reduce(x.value)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (out.grad,)
    return make_output(value, "reduce_from_tensor_region", (x,), _backward, call=(reduce_from_tensor_region, x, group))


def reduce_scatter_to_sequence_region(x: Tensor, group: Group) -> Tensor:
    """ḡ: y = this rank's 1/t of Σ_ranks x, split along s;  dx = all-gather(dy)."""
    value = group.reduce_scatter(x.value)

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return (group.all_gather(out.grad),)
    return make_output(value, "reduce_scatter_to_sequence_region", (x,), _backward,
                       call=(reduce_scatter_to_sequence_region, x, group))


def gathered_linear(x: Tensor, w: Tensor, b: Tensor | None, group: Group) -> Tensor:
    """y = all-gather_s(x) W + b, keeping only the sequence shard x: backward gathers it again.
    dW = X_fullᵀ dy,  db = Σ dy,  dx = reduce-scatter_s(dy Wᵀ)."""
    y = np.matmul(group.all_gather(x.value), w.value)
    if b is not None:
        y += b.value

    def _backward(out: Tensor, saved: Saved) -> Grads:
        g = out.grad
        dw = db = dx = None
        if w.requires_grad:
            full = group.all_gather(saved[x])
            dw = np.matmul(full.reshape(-1, full.shape[-1]).T, g.reshape(-1, g.shape[-1]))
        if b is not None and b.requires_grad:
            db = g.reshape(-1, g.shape[-1]).sum(axis=0)
        if x.requires_grad:
            dx = group.reduce_scatter(np.matmul(g, saved[w].T))
        return (dx, dw) if b is None else (dx, dw, db)
    inputs = (x, w) if b is None else (x, w, b)
    return make_output(y, "gathered_linear", inputs, _backward, saves=(x, w), call=(gathered_linear, x, w, b, group))


# ---- the layer ----

class ColumnParallelLinear(nn.Module):
    """This rank's output columns of a linear; its input enters the tensor-parallel region."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, group: Group, sequence_parallel: bool,
                 name: str) -> None:
        self.weight = Tensor(weight, requires_grad=True, name=f"{name}.weight")
        self.bias = Tensor(bias, requires_grad=True, name=f"{name}.bias")
        self.group, self.sequence_parallel = group, sequence_parallel

    def __call__(self, x: Tensor) -> Tensor:
        if self.sequence_parallel:
            return gathered_linear(x, self.weight, self.bias, self.group)
        return ops.linear(copy_to_tensor_region(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's input rows of a linear, without its bias: each rank's output is a partial sum."""

    def __init__(self, weight: np.ndarray, name: str) -> None:
        self.weight = Tensor(weight, requires_grad=True, name=f"{name}.weight")

    def __call__(self, x: Tensor) -> Tensor:
        return ops.linear(x, self.weight)


class ParallelTransformerLayer(nn.LayerRun):
    """One rank's share of ``nn.TransformerLayer(hidden_size, num_heads, ..., seed=seed)``.

    Built from the same seed as the one-process layer, then sliced: the rank owns query
    groups r·g/t .. (r+1)·g/t (their Q, K and V columns and out-projection rows) and MLP
    columns r·4h/t .. (r+1)·4h/t. Dropout masks are the matching pieces of the one-process
    layer's masks, so outputs and gradients equal it. With ``sequence_parallel`` the layer
    takes and returns this rank's slice of the sequence, (s/t, b, h).
    """

    def __init__(self, hidden_size: int, num_heads: int, group: Group, *, sequence_parallel: bool = False,
                 num_query_groups: int | None = None, dropout: float = 0.1, attention: str = "naive",
                 activations_checkpoint_granularity=None, causal: bool = True, dtype=np.float32,
                 seed: int | None = None) -> None:
        full = nn.TransformerLayer(hidden_size, num_heads, num_query_groups=num_query_groups, dropout=dropout,
                                   attention=attention, causal=causal, dtype=dtype, seed=seed)
        t, r, h = group.size, group.rank, hidden_size
        g, d = full.attention.groups, hidden_size // num_heads
        if num_heads % t or g % t:
            raise ValueError(f"ParallelTransformerLayer: {t} ranks must divide num_heads {num_heads} and the "
                             f"{g} key/value groups (num_query_groups={num_query_groups!r})")
        self.group, self.sequence_parallel, self.hidden_size = group, sequence_parallel, h
        self.granularity, self.calls = activations_checkpoint_granularity, 0
        self.ln1, self.ln2 = full.ln1, full.ln2

        # this rank's slices of the one-process weights: Q, K, V columns, out-projection rows, MLP columns
        q_cols = np.arange(r * h // t, (r + 1) * h // t)
        kv_cols = np.arange(r * g * d // t, (r + 1) * g * d // t)
        qkv_cols = np.concatenate([q_cols, h + kv_cols, h + g * d + kv_cols])
        mlp_cols = np.arange(r * 4 * h // t, (r + 1) * 4 * h // t)
        self.q_cols, self.qkv_cols, self.mlp_cols = q_cols, qkv_cols, mlp_cols
        groups = slice(r * g // t, (r + 1) * g // t)
        self.attention = nn.MultiHeadAttention(
            h // t, num_heads // t, num_query_groups=g // t, attention=attention, causal=causal, dtype=dtype,
            qkv=ColumnParallelLinear(full.attention.qkv.weight.value[:, qkv_cols],
                                     full.attention.qkv.bias.value[qkv_cols], group, sequence_parallel,
                                     "attention.qkv"),
            proj=RowParallelLinear(full.attention.proj.weight.value[q_cols], "attention.proj"),
            attention_dropout=nn.Dropout(dropout, seed=full.attention.attention_dropout.seed,
                                         shard=lambda shape: ((shape[0], g) + shape[2:], (slice(None), groups))),
            recompute_core=activations_checkpoint_granularity == "selective")
        self.proj_bias = full.attention.proj.bias  # added once, after the ranks' partial sums are reduced

        self.fc1 = ColumnParallelLinear(full.mlp.fc1.weight.value[:, mlp_cols], full.mlp.fc1.bias.value[mlp_cols],
                                        group, sequence_parallel, "mlp.fc1")
        self.fc2_weight = Tensor(full.mlp.fc2.weight.value[mlp_cols], requires_grad=True, name="mlp.fc2.weight")
        self.fc2_bias = full.mlp.fc2.bias

        shard = self._sequence_shard if sequence_parallel else None
        self.attention_dropout = nn.Dropout(dropout, seed=full.attention_dropout.seed, shard=shard)
        self.mlp_dropout = nn.Dropout(dropout, seed=full.mlp_dropout.seed, shard=shard)

    def _sequence_shard(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[slice, ...]]:
        n = shape[0]
        return (n * self.group.size,) + shape[1:], (slice(self.group.rank * n, (self.group.rank + 1) * n),)

    def _leave_tensor_region(self, x: Tensor) -> Tensor:
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_region(x, self.group)
        return reduce_from_tensor_region(x, self.group)

    def forward_with(self, key: tuple[int, ...]) -> Callable[[Tensor], Tensor]:
        def forward(x: Tensor) -> Tensor:
            attn = self._leave_tensor_region(self.attention(self.ln1(x), key)) + self.proj_bias
            y = x + self.attention_dropout(attn, key)
            hidden = ops.gelu(self.fc1(self.ln2(y)))
            mlp = self._leave_tensor_region(ops.matmul(hidden, self.fc2_weight)) + self.fc2_bias
            return y + self.mlp_dropout(mlp, key)
        return forward

    def replicated_parameters(self) -> list[Tensor]:
        """The parameters every rank holds whole: layer norms and the row-parallel biases."""
        return [self.ln1.weight, self.ln1.bias, self.proj_bias, self.ln2.weight, self.ln2.bias, self.fc2_bias]

    def sync_replicated_grads(self) -> None:
        """With sequence parallelism each rank saw 1/t of the tokens: sum the replicated grads."""
        if self.sequence_parallel:
            for p in self.replicated_parameters():
                if p.grad is not None:
                    p.grad = self.group.all_reduce(p.grad)


# ---- measuring and checking, per rank ----

def _layer_input(group: Group, s: int, b: int, h: int, dtype, sequence_parallel: bool) -> tuple[np.ndarray, Tensor]:
    full = np.random.default_rng(11).standard_normal((s, b, h)).astype(dtype)
    local = group.scatter_sequence(full) if sequence_parallel else full.copy()
    return full, Tensor(local, requires_grad=True)


def measure(group: Group, s: int, b: int, h: int, a: int, *, sequence_parallel: bool, granularity=None,
            num_query_groups=None, attention: str = "naive") -> dict:
    """This rank's measured bytes for one float16 layer, next to ``ag.memory_model``'s."""
    layer = ParallelTransformerLayer(h, a, group, sequence_parallel=sequence_parallel,
                                     num_query_groups=num_query_groups, attention=attention,
                                     activations_checkpoint_granularity=granularity, dtype=np.float16, seed=2)
    _, x = _layer_input(group, s, b, h, np.float16, sequence_parallel)
    measured = trace.measure_activation_bytes(layer, x)
    recompute = "selective" if attention == "flash" and granularity is None else granularity
    formula = memory_model.activation_bytes_per_layer(s, b, h, a, t=group.size, sequence_parallel=sequence_parallel,
                                                      recompute=recompute, num_query_groups=num_query_groups)
    return {"rank": group.rank, "measured": measured, "formula": formula}


def check_gradients(group: Group, s: int, b: int, h: int, a: int, *, sequence_parallel: bool,
                    granularity=None, num_query_groups=None, dropout: float = 0.1) -> float:
    """Largest relative difference, over the output, the input grad and every parameter grad,
    between this rank's share of the parallel layer and the one-process layer (float64)."""
    options = dict(num_query_groups=num_query_groups, dropout=dropout, dtype=np.float64, seed=5)
    single = nn.TransformerLayer(h, a, activations_checkpoint_granularity=granularity, **options)
    layer = ParallelTransformerLayer(h, a, group, sequence_parallel=sequence_parallel,
                                     activations_checkpoint_granularity=granularity, **options)
    full_x, x = _layer_input(group, s, b, h, np.float64, sequence_parallel)
    dy = np.random.default_rng(12).standard_normal((s, b, h))
    one = Tensor(full_x.copy(), requires_grad=True)
    out_one = single(one)
    out_one.backward(dy)
    out = layer(x)
    out.backward(group.scatter_sequence(dy) if sequence_parallel else dy)
    layer.sync_replicated_grads()

    def whole(v: np.ndarray) -> np.ndarray:
        return group.all_gather(v) if sequence_parallel else v
    q_cols, qkv_cols, mlp_cols = layer.q_cols, layer.qkv_cols, layer.mlp_cols
    pairs = [
        (whole(out.value), out_one.value), (whole(x.grad), one.grad),
        (layer.ln1.weight.grad, single.ln1.weight.grad), (layer.ln1.bias.grad, single.ln1.bias.grad),
        (layer.attention.qkv.weight.grad, single.attention.qkv.weight.grad[:, qkv_cols]),
        (layer.attention.qkv.bias.grad, single.attention.qkv.bias.grad[qkv_cols]),
        (layer.attention.proj.weight.grad, single.attention.proj.weight.grad[q_cols]),
        (layer.proj_bias.grad, single.attention.proj.bias.grad),
        (layer.ln2.weight.grad, single.ln2.weight.grad), (layer.ln2.bias.grad, single.ln2.bias.grad),
        (layer.fc1.weight.grad, single.mlp.fc1.weight.grad[:, mlp_cols]),
        (layer.fc1.bias.grad, single.mlp.fc1.bias.grad[mlp_cols]),
        (layer.fc2_weight.grad, single.mlp.fc2.weight.grad[mlp_cols]),
        (layer.fc2_bias.grad, single.mlp.fc2.bias.grad),
    ]
    worst = 0.0
    for got, want in pairs:
        if got is None or got.shape != want.shape:
            return float("inf")
        worst = max(worst, float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300)))
    return worst


SETTINGS = [  # (s, b, h, a, num_query_groups)
    (64, 2, 64, 4, None),
    (128, 1, 32, 4, None),
    (16, 4, 128, 4, None),
    (64, 2, 64, 8, 4),
]


def main(argv: list[str] | None = None) -> int:
    """``mpiexec -n T ag demo parallel``: per-rank measured bytes against the formulas;
    ``--check``: gradients against one process's layer; ``--json``: results on rank 0 as JSON."""
    parser = argparse.ArgumentParser(prog="ag demo parallel", description=main.__doc__)
    parser.add_argument("--check", action="store_true", help="compare gradients with the one-process layer")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on rank 0")
    args = parser.parse_args(argv)
    group = Group()
    rows = []
    for s, b, h, a, g in SETTINGS:
        if a % group.size or (g or a) % group.size or s % group.size:
            continue
        for sp in (False, True):
            for granularity in (None, "selective", "full"):
                if args.check:
                    error = check_gradients(group, s, b, h, a, sequence_parallel=sp, granularity=granularity,
                                            num_query_groups=g)
                    worst = group.comm.allreduce(error, op=group.MPI.MAX)
                    rows.append(dict(s=s, b=b, h=h, a=a, g=g, sequence_parallel=sp, granularity=granularity,
                                     max_relative_error=worst))
                else:
                    result = measure(group, s, b, h, a, sequence_parallel=sp, granularity=granularity,
                                     num_query_groups=g)
                    every = group.comm.gather(result, root=0)
                    if group.rank == 0:
                        rows.append(dict(s=s, b=b, h=h, a=a, g=g, sequence_parallel=sp, granularity=granularity,
                                         formula=result["formula"], measured=[r["measured"] for r in every]))
    if group.rank == 0:
        if args.json:
            print(json.dumps({"ranks": group.size, "rows": rows}))
        else:
            _print_rows(group.size, rows, args.check)
    return 0


def _print_rows(t: int, rows: list[dict], check: bool) -> None:
    if check:
        print(f"gradients of {t} ranks against one process (float64), largest relative difference")
        table(["s", "b", "h", "a", "g", "seq. parallel", "recompute", "max rel. diff"],
              [[r["s"], r["b"], r["h"], r["a"], r["g"] or r["a"], r["sequence_parallel"],
                r["granularity"] or "none", f"{r['max_relative_error']:.1e}"] for r in rows])
        return
    print(f"activation bytes per layer on each of {t} ranks (float16, measured with tracemalloc) "
          f"against ag.memory_model")
    table(["s", "b", "h", "a", "g", "seq. parallel", "recompute", "formula B", "measured B (per rank)",
           "measured/formula"],
          [[r["s"], r["b"], r["h"], r["a"], r["g"] or r["a"], r["sequence_parallel"],
            r["granularity"] or "none", r["formula"], " ".join(str(m) for m in r["measured"]),
            f"{max(r['measured']) / r['formula']:.4f}"] for r in rows])


if __name__ == "__main__":
    sys.exit(main())
