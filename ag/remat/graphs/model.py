"""The one memory model: what a schedule holds, event by event. ``simulate`` predicts a
schedule's peak with it (a chain plan's too: ``chains.cost.predict``), ``execute`` runs the same
events on the engine, and the MILP in ``checkmate`` writes the same accounting as constraints.

A schedule is Checkmate's pair of 0/1 matrices over stages t and nodes i (Jain et al. 2020):
``R[t, i]`` = node i is computed in stage t, ``S[t, i]`` = node i is resident when stage t
starts. Stages advance the frontier: stage t < n computes node t for the first time (and may
recompute earlier ones); stage n + j runs backward step j. Inside a stage:

1. a resident node that the stage does not use and the next does not keep is freed first;
2. the nodes with R = 1 are computed in forward order; after each, a node it read (or the
   node itself) that nothing later in the stage reads and the next stage does not keep is freed
   (Checkmate's FREE);
3. a backward stage then runs its step, which needs its reads resident;
4. what the next stage does not keep is freed.

Bytes alive = the leaves + the resident nodes' values + the hidden bytes of the nodes made
whose backward step has not run (each one's Tensor and closure, and the arrays that keeps: a
dropout mask) + the grads alive at that backward step.
Computing node k peaks at that plus its size plus its workspace; a backward step at that plus its
transient bytes. A view costs nothing itself but keeps its base: it is resident only with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .graph import Graph


class ScheduleError(ValueError):
    """A schedule that cannot run: it reads what is not resident, or keeps what it never made."""


@dataclass(frozen=True)
class Prediction:
    """What a plan costs: its peak bytes and its recomputation, in FLOPs and in op outputs (a
    chain's: layers) computed again; for a schedule, also the curve and the stage of the peak."""

    peak_bytes: int
    recompute_flops: int
    recompute_layers: int
    curve: tuple[tuple[str, int], ...] = field(default=(), repr=False)  # (event, bytes alive after it), for plots
    peak_stage: int = field(default=0, repr=False)  # the first stage that reaches the peak


def stage_step(graph: Graph, t: int) -> int | None:
    return t - graph.n if t >= graph.n else None


def events(graph: Graph, R: np.ndarray, S: np.ndarray) -> Iterator[tuple[str, int, int]]:
    """("free" | "compute" | "backward", stage, node or step), checking the schedule as it goes."""
    T, n = graph.stages, graph.n
    if R.shape != (T, n) or S.shape != (T, n):
        raise ScheduleError(f"schedule: R and S must have shape (stages, nodes) = {(T, n)}, "
                            f"got {R.shape} and {S.shape}")
    resident: set[int] = set()
    kept_rows, compute_rows = rows(S), rows(R)
    for t in range(T):
        kept = set(kept_rows[t])
        if kept - resident:
            raise ScheduleError(f"schedule: stage {t} keeps nodes {sorted(kept - resident)} that are not resident")
        for v in kept:
            if graph.nodes[v].view_of is not None and graph.nodes[v].view_of not in kept:
                raise ScheduleError(f"schedule: stage {t} keeps view {v} without its base {graph.nodes[v].view_of}")
        computes = compute_rows[t]
        if t < n and (t not in computes or max(computes) > t):
            raise ScheduleError(f"schedule: forward stage {t} must compute node {t} and nothing after it, "
                                f"computes {computes}")
        keep_next = set(kept_rows[t + 1]) if t + 1 < T else set()
        yield from stage_events(graph, t, resident, computes, keep_next)


def rows(M: np.ndarray) -> list[list[int]]:
    """The column indices of each row's True entries (one NumPy call for the whole matrix)."""
    out: list[list[int]] = [[] for _ in range(len(M))]
    for t, i in zip(*(axis.tolist() for axis in np.nonzero(M))):
        out[t].append(i)
    return out


def stage_events(graph: Graph, t: int, resident: set[int], computes: list[int],
                 keep_next: set[int]) -> Iterator[tuple[str, int, int]]:
    """One stage's events (rules 1 to 4), ``resident`` updated as they happen."""
    step = stage_step(graph, t)
    reads = graph.with_bases(graph.steps[step].reads) if step is not None else set()
    last_use: dict[int, int] = {}
    for p, k in enumerate(computes):
        for d in graph.with_bases(graph.nodes[k].deps) | {k}:
            last_use[d] = p
    for d in reads:
        last_use[d] = len(computes)
    for d in sorted(resident - keep_next - set(last_use)):
        resident.discard(d)
        yield "free", t, d
    for p, k in enumerate(computes):
        if k in resident:
            raise ScheduleError(f"schedule: stage {t} computes node {k}, which is already resident")
        missing = [d for d in graph.nodes[k].deps if d not in resident]
        if missing:
            raise ScheduleError(f"schedule: stage {t} computes node {k} ({graph.nodes[k].op}) but its "
                                f"inputs {missing} are not resident")
        resident.add(k)
        yield "compute", t, k
        for d in sorted(graph.with_bases(graph.nodes[k].deps) | {k}):
            if last_use.get(d) == p and d not in keep_next and d in resident:
                resident.discard(d)
                yield "free", t, d
    if step is not None:
        missing = sorted(set(graph.steps[step].reads) - resident)
        if missing:
            node = graph.steps[step].node
            raise ScheduleError(f"schedule: backward step {step} (of node {node}, "
                                f"{graph.nodes[node].op}) reads nodes {missing}, which are not resident")
        yield "backward", t, step
    for d in sorted(resident - keep_next):
        resident.discard(d)
        yield "free", t, d


def stage_peak(graph: Graph, t: int, kept, computes, keep_next) -> int:
    """The model's peak over stage t alone, given what it keeps in, computes and hands on
    (what a search over schedules needs: a stage's peak depends on nothing else)."""
    memory = Memory(graph)
    memory.hidden = graph.hidden_bytes_at(t)
    memory.values = sum(graph.nodes[i].size for i in kept)
    memory.stage(t)
    for kind, _, x in stage_events(graph, t, set(kept), sorted(computes), set(keep_next)):
        getattr(memory, kind)(x)
    return memory.peak


class Memory:
    """Bytes alive under the model, updated event by event."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.values = 0
        self.hidden = 0  # a node's graph: from its first computation to its backward step
        self.grads = 0
        self.leaf_bytes = graph.leaf_bytes  # the leaves stay: summed once
        self.peak = self.leaf_bytes
        self.t = -1  # the stage running

    @property
    def alive(self) -> int:
        return self.leaf_bytes + self.values + self.hidden + self.grads

    def stage(self, t: int) -> None:
        self.t = t
        step = stage_step(self.graph, t)
        self.grads = 0 if step is None else self.graph.steps[step].grad_bytes

    def compute(self, k: int) -> None:
        node = self.graph.nodes[k]
        self.values += node.size
        if k == self.t:  # the frontier: node k is first computed in stage k
            self.hidden += node.hidden_bytes
        self.peak = max(self.peak, self.alive + node.workspace_bytes)

    def free(self, k: int) -> None:
        self.values -= self.graph.nodes[k].size

    def backward(self, j: int) -> None:
        step = self.graph.steps[j]
        self.peak = max(self.peak, self.alive + step.extra_bytes)
        self.hidden -= self.graph.nodes[step.node].hidden_bytes  # the closure goes with its step


def simulate(graph: Graph, R: np.ndarray, S: np.ndarray) -> Prediction:
    """The schedule's predicted peak bytes and recomputed FLOPs under the model."""
    memory = Memory(graph)
    curve = []
    stage, peak_stage = -1, 0
    for kind, t, x in events(graph, R, S):
        if t != stage:
            stage = t
            memory.stage(t)
        before = memory.peak
        getattr(memory, kind)(x)
        curve.append((f"{kind} {x}", memory.alive))
        peak_stage = t if memory.peak > before else peak_stage
    flops = np.array([node.flops for node in graph.nodes], dtype=np.int64)
    again = (R.sum(axis=0).astype(np.int64) - 1).clip(min=0)
    return Prediction(int(memory.peak), int(again @ flops), int(again.sum()), tuple(curve), peak_stage)


def prune(graph: Graph, R: np.ndarray, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop what a stage computes or keeps and never uses: a recomputation nothing in its stage
    reads and the next does not keep, a kept value its stage neither reads nor hands on. The
    peak can only fall, and a solver's free zero-FLOP recomputations go. One pass, from the last
    stage back and the last node back: a value's use is decided by later stages and later nodes."""
    R, S = R.copy(), S.copy()
    handed_on: set[int] = set()
    for t in range(graph.stages - 1, -1, -1):
        step = stage_step(graph, t)
        used = handed_on | (graph.with_bases(graph.steps[step].reads) if step is not None else set())
        for i in np.flatnonzero(R[t])[::-1].tolist():
            if i != t and i not in used:
                R[t, i] = False
            else:
                used |= graph.with_bases(graph.nodes[i].deps)
        S[t, [i for i in np.flatnonzero(S[t]).tolist() if i not in used]] = False
        handed_on = graph.with_bases(np.flatnonzero(S[t]).tolist())
    return R, S
