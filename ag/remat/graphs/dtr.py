"""Dynamic tensor rematerialization (DTR, Kirisame et al. 2021) on a captured graph: no plan;
evict at run time the resident value with the lowest cost / (bytes × staleness) whenever the
bytes alive would pass the budget. ``dynamic`` also takes a chain (``chains.dtr``) or a function."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..chains.dtr import dynamic_chain
from .capture import capture
from .execute import Run, traced
from .graph import Graph
from .model import ScheduleError, prune
from .schedule import Schedule


def dynamic(target, *args, budget_bytes: int | None = None, heuristic: str = "dtr_eq"):
    """DTR: no plan, evict at run time under ``budget_bytes``.

    - ``dynamic(layers, x, budget_bytes)``: a chain, forward only; returns its output (see ``dynamic_chain``).
    - ``dynamic(graph, budget_bytes)``: a captured step, forward and backward; returns a DynamicRun.
    - ``dynamic(fn, *inputs, budget_bytes=B)``: captures ``fn`` first, then as for a graph.
    """
    if isinstance(target, Graph):
        budget = args[0] if args else budget_bytes
        return dynamic_graph(target, budget, heuristic=heuristic)
    if callable(target) and not isinstance(target, (list, tuple)):
        if budget_bytes is None:
            raise ValueError("dynamic(fn, *inputs): give budget_bytes=")
        return dynamic_graph(capture(target, *args), budget_bytes, heuristic=heuristic)
    if len(args) == 2 and budget_bytes is None:
        x, budget_bytes = args
    elif len(args) == 1:
        (x,) = args
    else:
        raise TypeError("dynamic(layers, x, budget_bytes): expected a chain's input and a budget")
    return dynamic_chain(target, x, budget_bytes)


HEURISTICS = ("dtr", "dtr_eq", "lru", "size")


@dataclass(frozen=True)
class DynamicRun:
    """What a DTR run of a captured step measured, beside what the memory model counted as it went."""

    peak_bytes: int            # tracemalloc
    predicted_peak_bytes: int  # the memory model, event by event, during the same run
    recompute_flops: int       # count_ops
    evictions: int
    budget_bytes: int
    heuristic: str
    seconds: float
    schedule: Schedule | None = None  # what it ran, as a schedule (None where it is none, see ``ran``)


def dynamic_graph(graph: Graph, budget_bytes: int, *, heuristic: str = "dtr_eq") -> DynamicRun:
    """Run ``graph``'s forward and backward with no plan, evicting at run time whenever the
    bytes alive (the memory model's, as for every planner) would pass ``budget_bytes``.

    The victim is the resident value with the smallest
    h(t) = cost(t) / (bytes(t) · staleness(t)) (Kirisame et al. 2021):

    - ``"dtr"``: cost = its own compute cost plus that of its evicted neighbourhood e*(t), the
      evicted values that recomputing it, or recomputing through it, would also need;
    - ``"dtr_eq"``: e*(t) approximated by union-find classes of evicted values, merged on
      eviction and never split (the paper's cheap variant);
    - ``"lru"``: cost 1, the stalest goes; ``"size"``: cost 1 and no staleness, the largest goes.

    An evicted value is recomputed, recursively through its evicted inputs, when something reads it.
    """
    if heuristic not in HEURISTICS:
        raise ValueError(f"dynamic: heuristic must be one of {', '.join(HEURISTICS)}, got {heuristic!r}")
    if not graph.steps:
        raise ValueError("dynamic: the graph has no backward step (nothing requires grad)")
    if not isinstance(budget_bytes, (int, np.integer)) or budget_bytes < graph.leaf_bytes:
        raise ValueError(f"dynamic: budget_bytes must be at least the {graph.leaf_bytes:,} bytes the inputs and "
                         f"parameters hold, got {budget_bytes!r}")
    start = time.perf_counter()
    with traced(graph) as measured:
        dtr = GraphDTR(graph, int(budget_bytes), heuristic, Run(graph, record=True))
        dtr.run()
        predicted, evictions, R, S = dtr.runner.memory.peak, dtr.evictions, dtr.runner.R, dtr.runner.S
        del dtr
    return DynamicRun(measured.peak_bytes, int(predicted), measured.recompute_flops, evictions,
                      int(budget_bytes), heuristic, time.perf_counter() - start, ran(graph, R, S, heuristic))


def ran(graph: Graph, R: np.ndarray, S: np.ndarray, heuristic: str) -> Schedule | None:
    """The schedule a DTR run recorded, which ``simulate`` prices and ``execute`` replays. A value
    evicted and recomputed inside one stage counts as kept through it (a stage computes a node
    once), so the replay can hold more than DTR did; None if the record breaks the model's rules."""
    try:
        return Schedule(graph, *prune(graph, R & ~S, S), f"DTR ({heuristic})")
    except ScheduleError:
        return None


def evicted_neighbourhood(graph: Graph, i: int, evicted: set[int]) -> set[int]:
    """e*(t): the evicted values reachable from node i through evicted values, along inputs and
    users alike (i itself excluded). Evicting i joins them: recomputing i needs its evicted
    inputs first, and recomputing an evicted user needs i."""
    ### BEGIN SOLUTION
    seen: set[int] = set()
    stack = [e for e in (*graph.nodes[i].deps, *graph.users[i]) if e in evicted]
    while stack:
        e = stack.pop()
        if e in seen or e == i:
            continue
        seen.add(e)
        stack.extend(x for x in (*graph.nodes[e].deps, *graph.users[e]) if x in evicted and x not in seen)
    return seen
    ### END SOLUTION


def h_dtr(cost: float, size: int, staleness: int) -> float:
    """h_DTR(t) = cost(t) / (bytes(t) · staleness(t)): evict the value that is cheap to recompute,
    big, and long unused."""
    ### BEGIN SOLUTION
    return cost / (size * staleness)
    ### END SOLUTION


class GraphDTR:
    """The run-time state: what is resident, what will still be read, and the eviction classes;
    ``runner`` computes and frees the values (``execute.Run``, or a replay that only records)."""

    def __init__(self, graph: Graph, budget: int, heuristic: str, runner) -> None:
        self.graph, self.budget, self.heuristic, self.runner = graph, budget, heuristic, runner
        n = graph.n
        self.uses = [len(graph.users[i]) for i in range(n)]  # forward reads still to come
        for step in graph.steps:
            for r in graph.with_bases(step.reads):
                self.uses[r] += 1
        for i in range(n):  # a view's reads keep its base's buffer wanted
            for v in graph.views(i):
                self.uses[i] += self.uses[v]
        self.cost = [node.flops + int(np.prod(node.shape)) for node in graph.nodes]
        self.last_access = [0] * n
        self.clock = 0
        self.evicted: set[int] = set()
        self.parent = list(range(n))  # union-find over evicted values (dtr_eq)
        self.class_cost = list(self.cost)
        self.evictions = 0

    def run(self) -> None:
        g, run = self.graph, self.runner
        for t in range(g.n):
            run.memory.stage(t)
            pinned = g.with_bases(g.nodes[t].deps) | {t}
            for d in g.nodes[t].deps:
                self.ensure(d, pinned)
            self.make_room(g.nodes[t].size + g.nodes[t].hidden_bytes + g.nodes[t].workspace_bytes, pinned)
            run.compute(t)
            self.touch(t)
            self.release(g.with_bases(g.nodes[t].deps) | {t}, forward_use_of=t)
        for j, step in enumerate(g.steps):
            run.memory.stage(g.n + j)
            reads = g.with_bases(step.reads)
            for r in sorted(reads):
                self.ensure(r, reads)
            self.make_room(step.extra_bytes, reads)
            run.backward(j)
            for r in reads:
                self.uses[r] -= 1
            self.release(reads)

    def ensure(self, i: int, pinned: set[int]) -> None:
        """Make node i resident, recomputing its evicted inputs first."""
        if i in self.runner.resident:
            self.touch(i)
            return
        node = self.graph.nodes[i]
        inner = pinned | self.graph.with_bases(node.deps) | {i}
        for d in node.deps:
            self.ensure(d, inner)
        self.make_room(node.size + node.workspace_bytes, inner)
        self.runner.compute(i)
        self.evicted.discard(i)
        self.touch(i)

    def touch(self, i: int) -> None:
        self.clock += 1
        self.last_access[i] = self.clock

    def release(self, nodes, forward_use_of: int | None = None) -> None:
        """Free what no later step will read (not an eviction: it is dead)."""
        g = self.graph
        if forward_use_of is not None:
            for d in g.with_bases(g.nodes[forward_use_of].deps):
                self.uses[d] -= 1
        for i in sorted(nodes, reverse=True):  # views before their bases
            if self.uses[i] <= 0 and i in self.runner.resident:
                self.runner.free(i)

    def make_room(self, extra: int, pinned: set[int]) -> None:
        while self.runner.memory.alive + extra > self.budget:
            victim = self.victim(pinned)
            if victim is None:
                return  # everything resident is in use now: run over budget rather than fail
            self.evict(victim)

    def victim(self, pinned: set[int]) -> int | None:
        g, best, best_score = self.graph, None, None
        for i in self.runner.resident:
            node = g.nodes[i]
            if i in pinned or node.view_of is not None or node.size == 0:
                continue
            if any(v in pinned for v in g.views(i)):
                continue
            score = self.score(i)
            if best_score is None or score < best_score:
                best, best_score = i, score
        return best

    def score(self, i: int) -> float:
        g = self.graph
        staleness = self.clock - self.last_access[i] + 1
        if self.heuristic == "lru":
            return 1 / staleness
        if self.heuristic == "size":
            return 1 / g.nodes[i].size
        if self.heuristic == "dtr":
            neighbours = evicted_neighbourhood(g, i, self.evicted)
            cost = self.cost[i] + sum(self.cost[e] for e in neighbours)
        else:
            roots = {self.find(e) for e in (*g.users[i], *g.nodes[i].deps) if e in self.evicted}
            cost = self.cost[i] + sum(self.class_cost[r] for r in roots)
        return h_dtr(cost, g.nodes[i].size, staleness)

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def evict(self, i: int) -> None:
        g = self.graph
        for v in g.views(i):
            if v in self.runner.resident:
                self.runner.free(v)
                self.evicted.add(v)
        self.runner.free(i)
        self.evicted.add(i)
        self.evictions += 1
        for e in (*g.nodes[i].deps, *g.users[i]):
            if e in self.evicted:
                a, b = self.find(i), self.find(e)
                if a != b:
                    self.parent[a] = b
                    self.class_cost[b] += self.class_cost[a]
