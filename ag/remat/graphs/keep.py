"""Schedules that keep a fixed set of nodes, written as Checkmate schedules on a captured graph
so that every strategy is priced by one memory model and run by one ``execute`` (the chain
planners in ``chain_plans``, NeMo's modes in ``nemo``).

``from_keep(graph, keep)``: forward computes every node once and keeps, past its last forward
use, only the nodes in ``keep`` that backward reads. The nodes between two kept ones form a
segment. The first backward step that reads a value of a segment that is gone replays the
segment: it recomputes every value of it that a step from then on reads (from the nearest
resident ancestors, leaves at worst) and keeps each while a later step still reads it. One
replay per segment, as ``sequential``'s segment mode and NeMo's recomputation do.

``keep_costly(graph, budget)``: dominance as a plan. An op that costs no FLOPs (relu, add, a
view) is remade for free from its inputs, so keep only what costs FLOPs to remake, and let
``complete`` remake the free ops in every stage that reads them; at tight budgets, where that
remakes long chains of free ops from afar, keep every m-th of them too.
"""
from __future__ import annotations

import numpy as np

import time

from .graph import Graph
from .model import prune
from .schedule import Schedule


def from_keep(graph: Graph, keep, planner: str = "keep", *, blocks=()) -> Schedule:
    """The schedule that keeps ``keep`` (node indices) from forward to backward.

    ``blocks`` are sets of nodes rerun whole, as ``checkpoint`` reruns a function: a replay that
    needs one node of a block recomputes every node of it, its output too."""
    T, n = graph.stages, graph.n
    bad = [k for k in keep if not (isinstance(k, (int, np.integer)) and 0 <= k < n)]
    if bad:
        raise ValueError(f"from_keep: {bad} are not node indices in 0..{n - 1}")
    keep = graph.with_bases(int(k) for k in keep)
    reads = [graph.with_bases(step.reads) for step in graph.steps]
    last_read = {i: n + j for j, r in enumerate(reads) for i in r}  # later steps overwrite: the last one
    last_user = {i: max(graph.users[i], default=-1) for i in range(n)}
    for i in range(n):  # a view's users keep its base's buffer in use
        for v in graph.views(i):
            last_user[i] = max(last_user[i], last_user[v])
    segment = np.cumsum([i in keep for i in range(n)])  # kept nodes close segments
    R = np.zeros((T, n), dtype=bool)
    S = np.zeros((T, n), dtype=bool)
    resident: set[int] = set()
    recomputed: set[int] = set()
    for t in range(T):
        S[t, sorted(resident)] = True
        if t < n:
            computes = {t}
        else:
            gone = reads[t - n] - resident
            replayed = {segment[i] for i in gone}
            wanted = gone | {i for i, last in last_read.items()
                             if last >= t and i not in resident and i not in keep and segment[i] in replayed}
            for block in blocks:
                if block & wanted:
                    wanted |= set(block) - resident
            computes = _missing(graph, wanted, resident)
            recomputed |= computes
        R[t, sorted(computes)] = True
        resident |= computes
        resident = graph.with_bases(i for i in resident if _wanted(i, t, n, keep, recomputed, last_user, last_read))
    return Schedule(graph, R, S, planner)


def _wanted(i: int, t: int, n: int, keep: set[int], recomputed: set[int], last_user: dict, last_read: dict) -> bool:
    """Is node i kept from stage t into t + 1?"""
    if t < n - 1 and last_user[i] > t:
        return True
    return (i in keep or i in recomputed) and last_read.get(i, -1) > t


def _missing(graph: Graph, wanted: set[int], resident: set[int]) -> set[int]:
    """The nodes to compute so that ``wanted`` is resident: each missing one and, recursively,
    its missing inputs."""
    out: set[int] = set()
    stack = [i for i in wanted if i not in resident]
    while stack:
        i = stack.pop()
        if i in out:
            continue
        out.add(i)
        stack.extend(d for d in graph.nodes[i].deps if d not in resident and d not in out)
    return out


def complete(graph: Graph, S_wanted: np.ndarray, planner: str) -> Schedule:
    """A schedule that keeps what ``S_wanted`` asks for and computes whatever that needs:
    the second phase of Checkmate's LP rounding."""
    T, n = graph.stages, graph.n
    R = np.zeros((T, n), dtype=bool)
    S = np.zeros((T, n), dtype=bool)
    resident: set[int] = set()
    for t in range(T):
        S[t, sorted(resident)] = True
        wanted = set(graph.steps[t - n].reads) if t >= n else {t} | set(graph.nodes[t].deps)
        if t + 1 < T:
            wanted |= set(np.flatnonzero(S_wanted[t + 1]).tolist())
        if t < n:
            wanted = {i for i in wanted if i <= t}
        computes = _missing(graph, wanted, resident)
        if t < n:
            computes.add(t)
        R[t, sorted(computes)] = True
        resident |= computes
        keep_next = set(np.flatnonzero(S_wanted[t + 1]).tolist()) if t + 1 < T else set()
        if t < n - 1:  # forward: a node its later users read stays, as in from_keep
            keep_next |= {i for i in resident if max(graph.users[i], default=-1) > t}
        resident = graph.with_bases(i for i in resident if i in keep_next)
    return Schedule(graph, *prune(graph, R, S), planner)


def keep_costly(graph: Graph, budget: int, deadline: float = float("inf")) -> Schedule:
    """The cheapest of ``keep_then_drop`` with checkpoints every m free ops, m in
    (s, s/2, 2s, 0), s = round(sqrt(D)) and D the longest free chain (``free_depth``): Chen's sqrt
    rule on the chains of free ops (residual adds) that a tight budget makes remade from afar.
    Tries no more once one fits at no recompute, or at ``deadline``."""
    longest = max(free_depth(graph), default=0)
    s = max(1, round(longest ** 0.5))
    found: list[Schedule] = []
    for every in dict.fromkeys((s, max(1, s // 2), 2 * s, 0) if longest > 1 else (0,)):
        fits = [f for f in found if f.predicted_peak_bytes <= budget]
        if found and (time.perf_counter() > deadline or any(f.recompute_flops == 0 for f in fits)):
            break
        found.append(keep_then_drop(graph, budget, deadline, every))
    fits = [f for f in found if f.predicted_peak_bytes <= budget]
    return min(fits or found[:1], key=lambda f: f.recompute_flops)


def free_depth(graph: Graph) -> list[int]:
    """d_v = 0 for a leaf or an op that costs FLOPs, else 1 + max d_u over its inputs u: how many
    free ops remaking v chains back through before it reaches a value worth keeping."""
    depth: list[int] = []
    for node in graph.nodes:
        depth.append(0 if node.flops > 0 or not node.deps else 1 + max(depth[u] for u in node.deps))
    return depth


def keep_then_drop(graph: Graph, budget: int, deadline: float = float("inf"), every: int = 0) -> Schedule:
    """Keep K = {v : flops_v > 0} (and, if ``every``, each free v with d_v a multiple of it)
    from its computation on and remake the free ops (``complete``).
    While the peak exceeds ``budget``, at the peak's stage t take the kept v that frees the most
    bytes a FLOP (max size_v / flops_v; a free one first): if t does not use v, keep v out of
    stages t .. u, u its next use (remade there, kept again after); if every kept v is used at t,
    free one after its last use in t until its next use u > t (the one used last that lowers the
    peak or moves it later), else drop the one at t for good. May not fit: the caller checks;
    stops at ``deadline``."""
    depth = free_depth(graph) if every else [0] * graph.n
    wanted = np.zeros((graph.stages, graph.n), dtype=bool)
    for v, node in enumerate(graph.nodes):
        wanted[v + 1:, v] = node.flops > 0 or depth[v] > 0 and depth[v] % every == 0
    best = complete(graph, wanted, "keep costly")
    while best.predicted_peak_bytes > budget and time.perf_counter() < deadline:
        t = best.prediction.peak_stage
        costly = [v for v in np.flatnonzero(wanted[t:t + 2].any(axis=0)).tolist() if best.S[t, v] or best.R[t, v]]
        if not costly:
            return best  # what overflows is not kept: no drop helps
        by_ratio = sorted(costly, key=lambda v: (-_bytes_a_flop(graph, v), v))
        unused = [v for v in by_ratio if best.S[t, v] and not _used(graph, best, t, v)]
        if unused:
            best, wanted = _drop(graph, best, wanted, unused[0], t)
            continue
        later = sorted((v for v in by_ratio if t + 1 < graph.stages and wanted[t + 1, v]),
                       key=lambda v: -_next_use(graph, best, v, t + 1))
        tried = (_drop(graph, best, wanted, v, t + 1) for v in later)
        lower = next((found for found in tried if _lower(found[0], best)), None)
        if lower is None:  # no drop after its last use in t lowers the peak: drop for good
            lower = _drop(graph, best, wanted, by_ratio[0], 0)
        best, wanted = lower
    return best


def _bytes_a_flop(graph: Graph, v: int) -> float:
    """size_v / flops_v: what keeping v costs a FLOP of remaking it saved (a free op: infinite)."""
    node = graph.nodes[v]
    return node.size / node.flops if node.flops else float("inf")


def _drop(graph: Graph, best: Schedule, wanted: np.ndarray, v: int, t: int) -> tuple[Schedule, np.ndarray]:
    """Keep v out of stages t .. u, u its first use from t on (remade there, kept again after);
    from 0, out for good."""
    u = _next_use(graph, best, v, t) if t else graph.stages
    wanted = wanted.copy()
    wanted[t:u + 1, v] = False
    return complete(graph, wanted, "keep costly"), wanted


def _next_use(graph: Graph, schedule: Schedule, v: int, t: int) -> int:
    """The first stage from t on that uses v (``graph.stages`` if none)."""
    return next((u for u in range(t, graph.stages) if _used(graph, schedule, u, v)), graph.stages)


def _lower(found: Schedule, best: Schedule) -> bool:
    """Has ``found`` a lower peak than ``best``, or the same one first reached at a later stage?"""
    return (found.predicted_peak_bytes, -found.prediction.peak_stage) < \
        (best.predicted_peak_bytes, -best.prediction.peak_stage)


def _used(graph: Graph, schedule: Schedule, t: int, v: int) -> bool:
    """Does stage t of ``schedule`` read v (a computation's input, its backward step's read)?"""
    reads = graph.steps[t - graph.n].reads if t >= graph.n else ()
    computed = np.flatnonzero(schedule.R[t]).tolist()
    return v in graph.with_bases(reads) or any(v in graph.with_bases(graph.nodes[k].deps) for k in computed)
