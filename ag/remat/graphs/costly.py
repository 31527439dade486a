"""A warm start by dominance: an op that costs no FLOPs (relu, add, a view) is remade for free
from its inputs, so ``keep_costly(graph, budget)`` keeps only what costs FLOPs to remake and lets
``keep.complete`` remake the free ops in every stage that reads them; at tight budgets, where that
remakes long chains of free ops from afar, it keeps every m-th of them too (Chen's sqrt rule).
"""
from __future__ import annotations

import time

import numpy as np

from .graph import Graph
from .keep import complete
from .schedule import Schedule


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
