"""Schedules that keep a fixed set of nodes, written as Checkmate schedules on a captured graph
so that every strategy is priced by one memory model and run by one ``execute`` (the chain
planners in ``chain_plans``, NeMo's modes in ``nemo``).

``from_keep(graph, keep)``: forward computes every node once and keeps, past its last forward
use, only the nodes in ``keep`` that backward reads. The nodes between two kept ones form a
segment. The first backward step that reads a value of a segment that is gone replays the
segment: it recomputes every value of it that a step from then on reads (from the nearest
resident ancestors, leaves at worst) and keeps each while a later step still reads it. One
replay per segment, as ``sequential``'s segment mode and NeMo's recomputation do.
"""
from __future__ import annotations

import numpy as np

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
