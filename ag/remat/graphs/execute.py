"""Run a schedule on the real engine: ``execute(schedule)`` computes, frees and backpropagates
exactly as ``model.events`` says, and measures the peak with tracemalloc and the recomputed
FLOPs with ``count_ops``. The grads land in the leaves' ``.grad``, as after ``backward()``.

``Run`` is the one runner (``remat.runner``) on a graph: node k is an op, made once with a graph
(stage t < n), which gives it a fresh Tensor and backward closure; a recomputation calls the op
again without a graph and puts the value back into that Tensor, whose closure never went away.
Once its backward step has run and its value is freed, the Tensor goes too.
"""
from __future__ import annotations

import contextlib
import gc
import time
import tracemalloc
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ... import trace
from ...errors import GraphError
from ...scopes import phase
from ...tensor import Tensor, backward_step
from ..runner import Runner
from .graph import Graph
from .model import Memory, events


@dataclass(frozen=True)
class Execution:
    """What running a schedule measured."""

    peak_bytes: int | None   # tracemalloc: everything the step allocated, leaves included
    recompute_flops: int     # count_ops, phase "recompute"
    predicted_peak_bytes: int
    seconds: float
    loss: float


class Run(Runner):
    """One run of the captured step: a fresh Tensor per node, made when the node is first computed.

    ``record=True`` writes down what ran as Checkmate's matrices: ``R[t, i]``, node i computed in
    stage t; ``S[t, i]``, node i resident when stage t began (what DTR ran, as a schedule)."""

    def __init__(self, graph: Graph, *, record: bool = False) -> None:
        super().__init__(graph.n)
        self.graph = graph
        self.tensors: list[Tensor | None] = [None] * graph.n
        self.resident: set[int] = set()
        self.memory = Memory(graph)
        self.workspace: dict[int, int] = {}
        self.kept: dict[int, int] = {}
        self.extra: dict[int, int] = {}
        self.grads: dict[int, int] = {}
        self.measuring = False
        self.loss = float("nan")
        shape = (graph.stages, graph.n) if record else (0, 0)
        self.R, self.S = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
        self.t = -1

    def note_stage(self) -> None:
        """On the first event of a stage, record what is resident as it begins."""
        if self.memory.t != self.t:
            self.t = self.memory.t
            if self.S.size:
                self.S[self.t, sorted(self.resident)] = True

    def value_of(self, original: Tensor) -> Tensor:
        k = self.graph.index_of.get(id(original))
        if k is None:
            return original  # a leaf: the same Tensor, so grads land where the user looks
        t = self.tensors[k]
        if t is None or t.value is None:
            raise GraphError(f"execute: node {k} ({self.graph.nodes[k].op}) is read but not resident")
        return t

    def first(self, k: int, x=None) -> None:
        with phase("forward"):  # stage k < n is the forward, whatever phase execute was called under
            self.tensors[k] = self.graph.nodes[k].call.run(self.value_of)

    def again(self, k: int, x=None) -> None:
        made = self.graph.nodes[k].call.run(self.value_of)
        if self.tensors[k] is None:  # remade after its backward step, which took its Tensor
            self.tensors[k] = made
        else:
            self.tensors[k].value = made.value

    def compute(self, k: int) -> None:
        """The runner's compute, with the event's bookkeeping: R, the workspace, what it leaves
        alive, the model's bytes."""
        self.note_stage()
        if self.R.size:
            self.R[self.t, k] = True
        if self.measuring:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
        super().compute(k)
        if self.measuring:
            now, peak = tracemalloc.get_traced_memory()
            self.workspace[k] = max(0, peak - now)
            self.kept[k] = now - before
        self.resident.add(k)
        self.memory.compute(k)
        if k == self.graph.loss:
            self.loss = float(self.tensors[k].value.item())

    def free(self, k: int) -> None:
        self.note_stage()
        self.tensors[k].value = None
        self.resident.discard(k)
        self.memory.free(k)
        self.forget_if_done(k)

    def backward(self, j: int) -> None:
        step = self.graph.steps[j]
        t = self.tensors[step.node]
        self.note_stage()
        if step.node == self.graph.loss:
            t.grad = np.ones(t.shape, t.dtype)
        if self.measuring:
            self.grads[j] = self._grad_bytes()
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
        self.memory.backward(j)
        backward_step(t)
        self.forget_if_done(step.node)
        if self.measuring:
            self.extra[j] = max(0, tracemalloc.get_traced_memory()[1] - before)

    def forget_if_done(self, k: int) -> None:
        """Drop node k's Tensor once its backward step has run and its value is freed: nothing
        reads it again, and its hidden bytes left the model with the step."""
        if k not in self.resident and self.tensors[k]._graph_freed:
            self.tensors[k] = None

    def _grad_bytes(self) -> int:
        seen: set[int] = set()
        total = 0
        for t in [*self.tensors, *self.graph.leaves]:
            g = None if t is None else t.grad
            while g is not None and g.base is not None:
                g = g.base
            if g is not None and id(g) not in seen:
                seen.add(id(g))
                total += g.nbytes
        return total

    def run(self, R: np.ndarray, S: np.ndarray) -> float:
        return self.play(events(self.graph, R, S))

    def play(self, plan) -> float:
        """Run the events ``plan`` lists: ("free" | "compute" | "backward", stage, node or step)."""
        stage = -1
        for kind, t, x in plan:
            if t != stage:
                stage = t
                self.memory.stage(t)
            getattr(self, kind)(x)
        return self.loss


def keep_all(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """The schedule with no rematerialization: compute each node once, keep it to the end."""
    T, n = graph.stages, graph.n
    R = np.zeros((T, n), dtype=bool)
    S = np.zeros((T, n), dtype=bool)
    for t in range(n):
        R[t, t] = True
        S[t + 1:, t] = True
    return R, S


def measure(graph: Graph, times: int = 3, *, clear_traces: bool = False) -> None:
    """Run the step, keeping everything, to measure what no plan changes: each node's workspace,
    its hidden bytes (what its first computation leaves alive beside its value's buffer: its
    Tensor, its backward closure and the arrays that keeps), the grads alive before each backward
    step and each step's transient bytes. The leaves' grads are put back as they were.

    A run's transient bytes include the interpreter's small objects, which CPython's free lists
    serve untraced or not depending on what ran before; the least of ``times`` measurings is the
    step's own, the same in a fresh process as in a warm one. ``clear_traces`` (when the caller
    started tracemalloc itself) starts each measured run with no traces: a block made before it
    and freed during an op would be taken off that op's bytes."""
    saved = [leaf.grad for leaf in graph.leaves]
    workspace = [None] * graph.n
    kept = [None] * graph.n
    extra = [None] * len(graph.steps)
    try:
        for _ in range(times):
            run = _measured_run(graph, clear_traces)
            workspace = [_least(w, run.workspace.get(k, 0)) for k, w in enumerate(workspace)]
            kept = [_least(w, run.kept.get(k, 0)) for k, w in enumerate(kept)]
            extra = [_least(e, run.extra.get(j, 0)) for j, e in enumerate(extra)]
    finally:
        for leaf, grad in zip(graph.leaves, saved):
            leaf.grad = grad
    for node, bytes_, left in zip(graph.nodes, workspace, kept):
        node.workspace_bytes = bytes_
        node.hidden_bytes = max(0, left - node.bytes)
    for j, step in enumerate(graph.steps):
        step.grad_bytes, step.extra_bytes = run.grads.get(j, 0), extra[j]


def _measured_run(graph: Graph, clear_traces: bool = False) -> Run:
    """Two runs keeping everything: the first warms up what NumPy caches, the second is measured
    once the cyclic collector has taken the first's graph (a Tensor and its closure form a cycle:
    collected during some op, it would be taken off that op's bytes). It runs with the collector
    off, after a full collection with no ``gc.callbacks``: a library's callback (hypothesis has
    one) would leave objects in the interpreter's free lists, served untraced to the first ops."""
    for measuring in (False, True):
        for leaf in graph.leaves:
            leaf.grad = None
        run = Run(graph)
        run.measuring = measuring
        with _quiet_collector(clear_traces) if measuring else contextlib.nullcontext():
            run.run(*keep_all(graph))
    return run


@contextlib.contextmanager
def _quiet_collector(clear_traces: bool) -> Iterator[None]:
    """A full collection with ``gc.callbacks`` set aside, then the collector off until the block
    ends (both as they were after); and, if ``clear_traces``, no traces kept from before."""
    callbacks, enabled = gc.callbacks[:], gc.isenabled()
    gc.callbacks.clear()
    try:
        gc.collect()
        gc.disable()
        if clear_traces:
            tracemalloc.clear_traces()
        yield
    finally:
        gc.callbacks[:] = callbacks
        if enabled:
            gc.enable()


def _least(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def execute(schedule, *, trace_memory: bool = True) -> Execution:
    """Run forward and backward as ``schedule`` says; measure the peak (tracemalloc, the leaves
    copied in so that they count) and the recomputed FLOPs (count_ops). ``trace_memory=False``
    runs without tracemalloc, for timing: the peak is then None. The leaves' grads start from
    None, as capture measured them: an earlier step's would be added into, their bytes untraced."""
    start = time.perf_counter()
    for leaf in schedule.graph.leaves:
        leaf.grad = None
    if not trace_memory:
        with trace.count_ops() as counts:
            loss = Run(schedule.graph).run(schedule.R, schedule.S)
        return Execution(None, int(counts.flops["recompute"]), schedule.predicted_peak_bytes,
                         time.perf_counter() - start, loss)
    plan = list(events(schedule.graph, schedule.R, schedule.S))  # the schedule's lists stay untraced
    run = Run(schedule.graph)  # and the runner's
    with traced(schedule.graph) as measured:
        loss = run.play(plan)
    return Execution(measured.peak_bytes, measured.recompute_flops, schedule.predicted_peak_bytes,
                     time.perf_counter() - start, loss)


@dataclass
class Measured:
    peak_bytes: int = 0
    recompute_flops: int = 0


@contextlib.contextmanager
def traced(graph: Graph) -> Iterator[Measured]:
    """Trace a run of ``graph``: tracemalloc from here, the leaves copied in so that they count
    (and put back after), and count_ops for the recomputed FLOPs."""
    originals = [leaf.value for leaf in graph.leaves]
    measured = Measured()
    trace.start_trace()
    try:
        for leaf in graph.leaves:
            leaf.value = leaf.value.copy()
        with trace.count_ops() as counts:
            yield measured
        measured.peak_bytes = int(trace.snapshot_trace().peak_bytes)
        measured.recompute_flops = int(counts.flops["recompute"])
    finally:
        for leaf, value in zip(graph.leaves, originals):
            leaf.value = value
        trace.end_trace()
