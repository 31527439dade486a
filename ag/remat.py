"""Rematerialization: keep some activations (checkpoints), recompute the rest in backward.

The engine does the per-tensor work (``Tensor.rematerializer``: a value is discarded
once consumed and beamed back when a backward step reads it). This module builds on
it for a chain of layers ``x_k = layers[k](x_{k-1})``:

- ``plan(n, strategy, ...)`` chooses which layer outputs to keep;
- ``sequential(layers, x, checkpoints)`` runs the chain and wires the rematerializers;
- ``predict(chain, checkpoints)`` says what a plan costs (peak bytes, recomputed FLOPs);
- ``dynamic(layers, x, budget_bytes)`` evicts at run time, DTR-style, with no plan;
- ``checkpoint(fn, *inputs)`` is the function form (``torch.utils.checkpoint``, Megatron's
  and NeMo's recomputation): keep a block's inputs only, rerun the block in backward.

Indices: layer k's output is ``x_k``; the chain's input (index -1) is always kept.
A layer whose output is kept keeps everything it made that backward reads; a layer
whose output is not kept has its output and its internals recomputed, by replaying
the layers from the nearest kept output under ``no_grad``.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .tensor import (GraphError, Tensor, _phase, accumulate_grad, backward, make_output, no_grad,
                     record_tensors, release_unneeded)

Layer = Callable[[Tensor], Tensor]
STRATEGIES = ("none", "all", "uniform", "block", "sqrt", "greedy", "optimal")


# ---- running a chain with checkpoints ----

def sequential(layers: Sequence[Layer], x: Tensor, checkpoints: Sequence[int], *,
               mode: str = "segment") -> Tensor:
    """Run ``layers`` on ``x`` keeping only the outputs listed in ``checkpoints``.

    ``mode="segment"`` (Chen et al.): the first time backward needs a value between two
    checkpoints, the whole run of layers up to it is replayed once and every value that
    backward will read is kept until read: one extra forward in all.
    ``mode="tensor"`` (the lecture's rematerializer): each value is recomputed on its own
    from the nearest checkpoint and nothing else is kept: least memory, quadratic recompute.
    """
    if mode not in ("segment", "tensor"):
        raise ValueError(f"sequential: mode must be 'segment' or 'tensor', got {mode!r}")
    kept = _check_checkpoints("sequential", checkpoints, len(layers))
    chain = _Chain(list(layers), x, mode)
    h, last_kept = x, -1
    for k, layer in enumerate(chain.layers):
        with record_tensors() as made:
            out = layer(h)
        if not isinstance(out, Tensor):
            raise TypeError(f"sequential: layer {k} returned {type(out).__name__}, expected a Tensor")
        release_unneeded([out], [h])
        chain.add(made, out)
        if k in kept:
            last_kept = k
        else:
            chain.make_recomputable(k, last_kept, made, out)
        h = out
    return h


def checkpoint(fn: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
    """y = fn(*inputs), keeping nothing that fn makes inside: only the inputs are saved.

    Forward runs ``fn`` under ``no_grad``, so it builds no graph and its intermediates are
    freed as it goes. Backward runs ``fn`` again on the saved inputs, this time with a graph,
    and backpropagates ``dy`` through that rerun: one extra forward of the block, the price of
    not storing its activations. ``fn`` must compute the same thing twice (seed its dropout).
    """
    for t in inputs:
        if not isinstance(t, Tensor):
            raise TypeError(f"checkpoint: inputs must be Tensors, got {type(t).__name__}")
    with no_grad():
        y = fn(*inputs)
    if not isinstance(y, Tensor):
        raise TypeError(f"checkpoint: fn returned {type(y).__name__}, expected a Tensor")

    def _backward(out: Tensor) -> None:
        again = [Tensor(t.value, requires_grad=t.requires_grad) for t in inputs]
        with _phase("recompute"):
            rerun = fn(*again)
        release_unneeded([rerun], again)  # as the first forward would have: keep what backward reads
        if rerun.shape != out.shape:
            raise GraphError(f"checkpoint: fn returned shape {rerun.shape} on its rerun, "
                             f"{out.shape} the first time")
        backward(rerun, out.grad)
        for t, a in zip(inputs, again):
            if a.grad is not None:
                accumulate_grad(t, a.grad)
    return make_output(y.value, "checkpoint", inputs, _backward, saves=inputs)


class _Chain:
    """What a replay needs: the layers, what each made the first time, and the kept outputs.

    It holds the tensors weakly: the graph decides how long they live, as without it.
    """

    def __init__(self, layers: list[Layer], x: Tensor, mode: str) -> None:
        self.layers, self.x, self.mode = layers, x, mode
        self.made: list[list[weakref.ref]] = []
        self.outputs: list[weakref.ref] = []

    def add(self, made: list[Tensor], out: Tensor) -> None:
        self.made.append([weakref.ref(t) for t in made])
        self.outputs.append(weakref.ref(out))

    def make_recomputable(self, k: int, start: int, made: list[Tensor], out: Tensor) -> None:
        for t in made:
            if t.value is None:
                continue  # released: no backward step reads it
            t.rematerializer = _Replay(self, start, k, t)
            if t is not out:
                t.value = None  # already consumed inside the layer: not a checkpoint
        # the output is discarded by the engine when the next layer consumes it

    def replay(self, start: int, stop: int, wanted: Tensor) -> np.ndarray:
        """Recompute layers start+1..stop from the kept output ``start``; return ``wanted``'s value."""
        first = self.x if start < 0 else self.outputs[start]()
        if first is None or first.value is None:
            raise GraphError(f"replay of layers {start + 1}..{stop}: the kept output x_{start} "
                             "is gone; was backward already past it?")
        h, found = first, None
        with no_grad():
            for k in range(start + 1, stop + 1):
                with record_tensors() as again:
                    h = self.layers[k](h)
                value = self._restore(k, again, wanted)
                found = value if value is not None else found
                self.restored(k)
        if found is None:
            raise GraphError(f"replay of layers {start + 1}..{stop} did not recompute {wanted.describe()}")
        return found

    def restored(self, k: int) -> None:
        """Called after layer k's values were restored by a replay."""

    def _restore(self, k: int, again: list[Tensor], wanted: Tensor) -> np.ndarray | None:
        first = self.made[k]
        if len(again) != len(first):
            raise GraphError(f"replay of layer {k} made {len(again)} tensors where the forward made "
                             f"{len(first)}: a replayed layer must run the same ops")
        found = None
        for ref, new in zip(first, again):
            original = ref()
            if original is None:
                continue
            if original.shape != new.shape:
                raise GraphError(f"replay of layer {k} made shape {new.shape} where the forward "
                                 f"made {original.shape} for {original.describe()}")
            if original is wanted:
                found = new.value
            elif self.mode == "segment" and original.value is None and original._needed_by > 0:
                original.value = new.value
        return found


class _Replay:
    """A tensor's rematerializer: replay layers start+1..stop and hand back its value."""

    def __init__(self, chain: _Chain, start: int, stop: int, tensor: Tensor) -> None:
        self.chain, self.start, self.stop = chain, start, stop
        self.tensor = weakref.ref(tensor)  # a strong one would be a cycle through the tensor

    def __call__(self) -> np.ndarray:
        return self.chain.replay(self.start, self.stop, self.tensor())


def _check_checkpoints(op: str, checkpoints: Sequence[int], n: int) -> set[int]:
    kept = set()
    for c in checkpoints:
        if not isinstance(c, (int, np.integer)) or not 0 <= c < n:
            raise ValueError(f"{op}: checkpoint {c!r} is not a layer index in 0..{n - 1}")
        kept.add(int(c))
    return kept


# ---- what a plan costs ----

@dataclass(frozen=True)
class ChainProfile:
    """A chain as the planner sees it: output bytes and forward FLOPs of each layer.

    The model assumes each layer's backward reads its input (as a matmul does), so
    backward needs x_{-1}..x_{n-2}; ``profile`` measures a real chain.
    """

    sizes: tuple[int, ...]
    costs: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.costs) or not self.sizes:
            raise ValueError(f"ChainProfile: need one size and one cost per layer, got "
                             f"{len(self.sizes)} sizes and {len(self.costs)} costs")

    @property
    def n(self) -> int:
        return len(self.sizes)


@dataclass(frozen=True)
class Prediction:
    """Peak bytes of activations and their grads over forward + backward, and the recompute bill."""

    peak_bytes: int
    recompute_flops: int
    recompute_layers: int


def profile(layers: Sequence[Layer], x) -> ChainProfile:
    """Run the chain once without a graph and record each layer's output bytes and FLOPs."""
    from .trace import count_ops
    sizes, costs = [], []
    h = x.value if isinstance(x, Tensor) else x
    with no_grad():
        for layer in layers:
            with count_ops() as counts:
                out = layer(Tensor(h))
            sizes.append(out.nbytes)
            costs.append(sum(counts.flops.values()))
            h = out.value
    return ChainProfile(tuple(sizes), tuple(costs))


def as_profile(chain) -> ChainProfile:
    """Accept a ChainProfile, or a list of sizes (each layer then costs 1: FLOPs count layers)."""
    if isinstance(chain, ChainProfile):
        return chain
    sizes = tuple(int(s) for s in chain)
    return ChainProfile(sizes, (1,) * len(sizes))


def predict(chain, checkpoints: Sequence[int], *, mode: str = "segment") -> Prediction:
    """Peak activation bytes and recomputed FLOPs of keeping ``checkpoints`` (see ``sequential``).

    Alive at backward step m (layer m, from n-1 down): the kept outputs up to m, the
    replayed values of the run before m (segment mode) or the one value x_{m-1} (tensor
    mode), and two grads, x_m's and x_{m-1}'s. Forward holds the kept outputs, the layer's
    input and its output.
    """
    p = as_profile(chain)
    kept = _check_checkpoints("predict", checkpoints, p.n)
    s, n = p.sizes, p.n
    peak, flops, layers = 0, 0, 0
    kept_up_to = np.cumsum([s[i] if i in kept else 0 for i in range(n)])
    for k in range(n):  # forward
        before = kept_up_to[k - 1] if k > 0 else 0
        transient = s[k - 1] if k > 0 and k - 1 not in kept else 0
        peak = max(peak, before + transient + s[k])
    for m in range(n - 1, -1, -1):  # backward
        new_grad = s[m - 1] if m > 0 else 0
        step = s[m] + new_grad  # x_m's grad, and x_{m-1}'s being made
        if m > 0 and m - 1 not in kept:
            start = max([c for c in kept if c < m - 1], default=-1)
            run = range(start + 1, m)
            if mode == "segment":
                step += sum(s[i] for i in run)
            else:  # the replay walks the run holding two values at a time, keeps only x_{m-1}
                walk = max((s[i] + s[i + 1] for i in run if i + 1 < m), default=0)
                step = s[m] + max(walk, s[m - 1] + new_grad)
                flops += sum(p.costs[i] for i in run)
                layers += len(run)
        peak = max(peak, kept_up_to[m] + step)
    if mode == "segment":
        flops, layers = _segment_recompute(p, kept)
    return Prediction(int(peak), int(flops), layers)


def _segment_recompute(p: ChainProfile, kept: set[int]) -> tuple[int, int]:
    """Each run of non-kept outputs that backward reads is replayed once."""
    needed = [i for i in range(p.n - 1) if i not in kept]  # x_0..x_{n-2} are read by backward
    return sum(p.costs[i] for i in needed), len(needed)


# ---- choosing checkpoints ----

def plan(n_layers: int, strategy: str, *, num_layers: int | None = None,
         budget_bytes: int | None = None, chain=None) -> list[int]:
    """The sorted layer indices whose outputs to keep (the input is always kept).

    - ``none``: keep every output;  ``all``: keep nothing but the input.
    - ``uniform`` (NeMo): cut the chain into blocks of ``num_layers`` and keep each block's input.
    - ``block`` (NeMo): recompute only the first ``num_layers`` layers, keep everything after.
    - ``sqrt`` (Chen et al. 2016): keep every ⌊√n⌋-th output.
    - ``greedy`` (Chen et al. 2016): close a segment when its bytes pass a threshold, the
      threshold searched so the predicted peak fits ``budget_bytes``.
    - ``optimal``: the fewest recomputed FLOPs whose predicted peak fits ``budget_bytes``
      (dynamic programming over the last kept output and the bytes kept so far; exact for
      the ``predict`` model; O(n² · P) time, P the number of Pareto-optimal (bytes, FLOPs)
      prefixes per position, at most n when all layers are the same size).

    ``greedy`` and ``optimal`` need ``chain`` (a ChainProfile or per-layer sizes) and
    ``budget_bytes``; their peak and budget are in ``predict``'s segment-mode terms.
    """
    if not isinstance(n_layers, (int, np.integer)) or n_layers < 1:
        raise ValueError(f"plan: n_layers must be a positive integer, got {n_layers!r}")
    if strategy not in STRATEGIES:
        raise ValueError(f"plan: unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    n = int(n_layers)
    if strategy == "none":
        return list(range(n))
    if strategy == "all":
        return []
    if strategy in ("uniform", "block"):
        k = _num_layers(strategy, num_layers, n)
        return _every(k, n) if strategy == "uniform" else list(range(k - 1, n))
    if strategy == "sqrt":
        ### BEGIN SOLUTION
        return _every(math.isqrt(n), n)
        ### END SOLUTION
    p = as_profile(chain) if chain is not None else None
    if p is None or budget_bytes is None:
        raise ValueError(f"plan: strategy {strategy!r} needs chain= (sizes or a ChainProfile) "
                         "and budget_bytes=")
    if p.n != n:
        raise ValueError(f"plan: chain describes {p.n} layers, n_layers is {n}")
    return _greedy(p, budget_bytes) if strategy == "greedy" else _optimal(p, budget_bytes)


def mode_for(strategy: str) -> str:
    """The replay mode a strategy assumes: the lecture's per-tensor recompute for ``all``."""
    return "tensor" if strategy == "all" else "segment"


def _num_layers(strategy: str, num_layers, n: int) -> int:
    if not isinstance(num_layers, (int, np.integer)) or not 1 <= num_layers <= n:
        raise ValueError(f"plan: strategy {strategy!r} needs num_layers in 1..{n}, got {num_layers!r}")
    return int(num_layers)


def _every(k: int, n: int) -> list[int]:
    """Outputs k-1, 2k-1, ...: the inputs of blocks of k layers (the chain's output is not one)."""
    return list(range(k - 1, n - 1, k))


def _fits(p: ChainProfile, kept: list[int], budget: int) -> bool:
    return predict(p, kept).peak_bytes <= budget


def _greedy(p: ChainProfile, budget: int) -> list[int]:
    best = None
    for threshold in sorted({0} | set(np.cumsum(p.sizes).tolist()) | set(p.sizes)):  # 0 keeps all
        kept, run = [], 0
        for k, size in enumerate(p.sizes[:-1]):
            run += size
            if run > threshold:
                kept.append(k)
                run = 0
        if _fits(p, kept, budget):
            cost = predict(p, kept)
            key = (cost.recompute_flops, cost.peak_bytes)
            if best is None or key < best[0]:
                best = (key, kept)
    if best is None:
        raise ValueError(f"plan: greedy finds no plan whose predicted peak fits {budget:,} bytes")
    return best[1]


def _optimal(p: ChainProfile, budget: int) -> list[int]:
    """Dynamic programming over (last kept output c, bytes kept so far) with Pareto pruning."""
    s, f, n = p.sizes, p.costs, p.n
    # fronts[c]: Pareto-optimal (kept bytes, recompute FLOPs, kept list) with c the last kept
    fronts: dict[int, list[tuple[int, int, tuple[int, ...]]]] = {-1: [(0, 0, ())]}
    best = None
    ### BEGIN SOLUTION
    for c in range(-1, n):
        for kept_bytes, flops, kept in _pareto(fronts.get(c, [])):
            for j in range(c + 1, n + 1):  # j = n: keep nothing more
                local = _local_peak(s, c, j)
                if kept_bytes + local > budget:
                    continue
                run_cost = sum(f[c + 1:min(j, n - 1)])
                if j == n:
                    candidate = (flops + run_cost, kept)
                    if best is None or candidate[0] < best[0]:
                        best = candidate
                else:
                    fronts.setdefault(j, []).append((kept_bytes + s[j], flops + run_cost, kept + (j,)))
    ### END SOLUTION
    if best is None:
        raise ValueError(f"plan: no checkpoint plan has a predicted peak within {budget:,} bytes "
                         "(segment mode; see ag.remat.predict)")
    return list(best[1])


def _pareto(front):
    """Keep the entries no other entry beats on both kept bytes and FLOPs."""
    result, best_flops = [], None
    for entry in sorted(front):
        if best_flops is None or entry[1] < best_flops:
            result.append(entry)
            best_flops = entry[1]
    return result


def _local_peak(s: tuple[int, ...], c: int, j: int) -> int:
    """The peak over layers c+1..j beyond the bytes kept up to c, when c and j are kept
    (j = n: nothing kept after c): predict's segment-mode terms, step by step."""
    n = len(s)
    end = min(j, n - 1)
    peak = 0
    for k in range(c + 1, end + 1):  # forward: the input (if not kept) and the output
        transient = s[k - 1] if k - 1 > c else 0
        peak = max(peak, transient + s[k])
    for m in range(c + 1, end + 1):  # backward
        kept_here = s[j] if j < n and m == j else 0
        replayed = sum(s[c + 1:m]) if m - 1 > c else 0
        grads = s[m] + (s[m - 1] if m > 0 else 0)
        peak = max(peak, kept_here + replayed + grads)
    return peak



# ---- dynamic eviction (DTR) ----

def dynamic(layers: Sequence[Layer], x: Tensor, budget_bytes: int) -> Tensor:
    """Run ``layers`` with no plan: keep outputs until the chain's resident bytes pass
    ``budget_bytes``, then evict the layer with the lowest
    cost / (bytes × staleness) (Kirisame et al., Dynamic Tensor Rematerialization), where
    cost is the FLOPs to replay it from the nearest resident output. An evicted value is
    replayed when something reads it, and the budget is enforced again.
    """
    if budget_bytes <= 0:
        raise ValueError(f"dynamic: budget_bytes must be positive, got {budget_bytes!r}")
    from .trace import count_ops
    chain = _Dynamic(list(layers), x, int(budget_bytes))
    h = x
    for k, layer in enumerate(chain.layers):
        with record_tensors() as made, count_ops() as counts:
            out = layer(h)
        release_unneeded([out], [h])
        chain.add(made, out)
        chain.costs.append(max(1, sum(counts.flops.values())))
        chain.touch(k)
        chain.enforce_budget(protect={k})
        h = out
    return h


class _Dynamic(_Chain):
    """A chain whose layers are evicted and replayed at run time, under a byte budget."""

    def __init__(self, layers: list[Layer], x: Tensor, budget: int) -> None:
        super().__init__(layers, x, "segment")
        self.budget = budget
        self.costs: list[int] = []
        self.last_use: list[int] = []
        self.clock = 0
        self.evictions = 0
        self.wanted_layer = -1

    def touch(self, k: int) -> None:
        self.clock += 1
        self.last_use.extend([0] * (k + 1 - len(self.last_use)))
        self.last_use[k] = self.clock

    def _live(self, k: int) -> list[Tensor]:
        return [t for t in (ref() for ref in self.made[k]) if t is not None and t.value is not None]

    def resident_bytes(self) -> int:
        return sum(t.nbytes for k in range(len(self.made)) for t in self._live(k))

    def _replay_cost(self, k: int) -> int:
        cost, j = self.costs[k], k - 1
        while j >= 0 and not self._resident(j):
            cost += self.costs[j]
            j -= 1
        return cost

    def _resident(self, k: int) -> bool:
        out = self.outputs[k]()
        return out is not None and out.value is not None

    def enforce_budget(self, protect: set[int]) -> None:
        while self.resident_bytes() > self.budget:
            scores = []
            for k in range(len(self.made)):
                live = self._live(k)
                if k in protect or not live:
                    continue
                staleness = self.clock - self.last_use[k] + 1
                size = sum(t.nbytes for t in live)
                scores.append((self._replay_cost(k) / (size * staleness), k))
            if not scores:
                return  # everything left is in use right now: run over budget rather than fail
            self.evict(min(scores)[1])

    def evict(self, k: int) -> None:
        for t in self._live(k):
            t.rematerializer = _DynamicReplay(self, k, t)
            t.value = None
        self.evictions += 1

    def replay_to(self, k: int, wanted: Tensor) -> np.ndarray:
        start = k - 1
        while start >= 0 and not self._resident(start):
            start -= 1
        self.wanted_layer = k
        return self.replay(start, k, wanted)

    def restored(self, k: int) -> None:
        self.touch(k)
        self.enforce_budget(protect={k, self.wanted_layer, self.wanted_layer + 1})


class _DynamicReplay:
    """An evicted tensor's rematerializer: replay from the nearest resident output."""

    def __init__(self, chain: _Dynamic, k: int, tensor: Tensor) -> None:
        self.chain, self.k = chain, k
        self.tensor = weakref.ref(tensor)

    def __call__(self) -> np.ndarray:
        return self.chain.replay_to(self.k, self.tensor())
