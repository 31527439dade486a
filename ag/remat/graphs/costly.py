"""A warm start by dominance: an op that costs no FLOPs (relu, add, a view) is remade for free
from its inputs, so ``keep_costly(graph, budget)`` keeps only what costs FLOPs to remake and lets
``keep.complete`` remake the free ops in every stage that reads them; at tight budgets, where that
remakes long chains of free ops from afar, it keeps every m-th of them too (Chen's sqrt rule),
or one free op in place of the kept values it is remade from (``_merged``), and a second one in
place of as many costly values as the peak overflows by, replayed once (``_replayed``); at the
peak, a free op that a backward step reads in place of its costly inputs (``_swapped``).
"""
from __future__ import annotations

import time

import numpy as np

from .graph import Graph
from .keep import complete
from .schedule import Schedule


def keep_costly(graph: Graph, budget: int, deadline: float = float("inf")) -> Schedule:
    """The cheapest of ``keep_then_drop`` with one merged free op (the fastest at tight budgets),
    that and a replayed one, and with checkpoints every m free ops, m in (s, s/2, 2s, 0),
    s = round(sqrt(D)) and D the longest free chain (``free_depth``): Chen's sqrt rule on the chains
    of free ops (residual adds) that a tight budget makes remade from afar. Tries no more once one
    fits at no recompute, or at ``deadline``."""
    longest = max(free_depth(graph), default=0)
    s = max(1, round(longest ** 0.5))
    found: list[Schedule] = []
    spacings = dict.fromkeys((s, max(1, s // 2), 2 * s, 0) if longest > 1 else (0,))
    for every, merge, replay in [(0, True, False), (0, True, True)] + [(every, False, False) for every in spacings]:
        fits = [f for f in found if f.predicted_peak_bytes <= budget]
        if found and (time.perf_counter() > deadline or any(f.recompute_flops == 0 for f in fits)):
            break
        found.append(keep_then_drop(graph, budget, deadline, every, merge, replay=replay))
    fits = [f for f in found if f.predicted_peak_bytes <= budget]
    return min(fits or found[:1], key=lambda f: f.recompute_flops)


def free_depth(graph: Graph) -> list[int]:
    """d_v = 0 for a leaf or an op that costs FLOPs, else 1 + max d_u over its inputs u: how many
    free ops remaking v chains back through before it reaches a value worth keeping."""
    depth: list[int] = []
    for node in graph.nodes:
        depth.append(0 if node.flops > 0 or not node.deps else 1 + max(depth[u] for u in node.deps))
    return depth


def keep_then_drop(graph: Graph, budget: int, deadline: float = float("inf"), every: int = 0,
                   merge: bool = False, swap: bool = True, replay: bool = False) -> Schedule:
    """Keep K = {v : flops_v > 0}, each moved down to its relu (``moved_down``), and, if ``every``,
    each free v with d_v a multiple of it, from its computation on; if ``merge``, one free op in
    place of the values it is remade from (``_merged``); remake the free ops (``complete``); if
    ``replay`` and that overflows, one free op in place of costly values that free the overflow
    (``_replayed``).
    While the peak exceeds ``budget``, at the peak's stage t: if ``swap`` and t is a backward
    stage that remakes a free op it reads, keep that op in place of its costly inputs
    (``_swapped``) where that lowers the peak; else take the kept v that frees the most
    bytes a FLOP (``_bytes_a_flop``; a free one first): if t does not use v, keep v out of
    stages t .. u, u its next use (remade there, kept again after); if every kept v is used at t,
    free one after its last use in t until its next use u > t (the one used last that lowers the
    peak or moves it later), else drop the one at t for good. May not fit: the caller checks;
    stops at ``deadline``."""
    depth = free_depth(graph) if every else [0] * graph.n
    wanted = np.zeros((graph.stages, graph.n), dtype=bool)
    for v in moved_down(graph):
        wanted[v + 1:, v] = True
    for v in range(graph.n):
        wanted[v + 1:, v] |= depth[v] > 0 and depth[v] % every == 0
    if merge:
        wanted = _merged(graph, wanted)
    best = complete(graph, wanted, "keep costly")
    if replay and best.predicted_peak_bytes > budget:
        wanted = _replayed(graph, wanted, best.predicted_peak_bytes - budget)
        best = complete(graph, wanted, "keep costly")
    while best.predicted_peak_bytes > budget and time.perf_counter() < deadline:
        t = best.prediction.peak_stage
        costly = [v for v in np.flatnonzero(wanted[t:t + 2].any(axis=0)).tolist() if best.S[t, v] or best.R[t, v]]
        if not costly:
            return best  # what overflows is not kept: no drop helps
        by_ratio = sorted(costly, key=lambda v: (-_bytes_a_flop(graph, v), v))
        swapped = _swapped(graph, best, wanted, t) if swap else None
        if swapped is not None and _lower(swapped[0], best):
            best, wanted = swapped
            continue
        unused = [v for v in by_ratio if best.S[t, v] and not _used(graph, best, t, v)]
        if unused:
            best, wanted = _drop(graph, best, wanted, unused[0], t)
            continue
        later = sorted((v for v in by_ratio if t + 1 < graph.stages and wanted[t + 1, v]),
                       key=lambda v: -_next_use(graph, best, v, t + 1))
        tried = (_drop(graph, best, wanted, v, t + 1) for v in later if time.perf_counter() < deadline)
        lower = next((found for found in tried if _lower(found[0], best)), None)
        if lower is None:  # no drop after its last use in t lowers the peak: drop for good
            lower = _drop(graph, best, wanted, by_ratio[0], 0)
        best, wanted = lower
    return best


def moved_down(graph: Graph) -> list[int]:
    """The values to keep, one for each v that costs FLOPs: v, or, while no backward step reads
    it and its one user u is a free op of v alone no larger than it (relu), u. Keeping u
    dominates keeping v: the same bytes or fewer, and every use of v is remade from u for free."""
    read = set().union(*(graph.with_bases(step.reads) for step in graph.steps))
    kept = []
    for v, node in enumerate(graph.nodes):
        while node.flops and v not in read and len(graph.users[v]) == 1:
            u = graph.users[v][0]
            if graph.nodes[u].flops or list(graph.nodes[u].deps) != [v] or graph.nodes[u].size > graph.nodes[v].size:
                break
            v = u
        if node.flops:
            kept.append(v)
    return kept


def _merged(graph: Graph, wanted: np.ndarray) -> np.ndarray:
    """Keep the first free op c remade from two or more kept values A_c (through free ops only)
    instead of them: each a in A_c is out from c's computation until the first backward step that
    reads a. One slot or more freed over most of backward, for one remake of each a, late."""
    n = graph.n
    read_at = {}
    for j, step in enumerate(graph.steps):
        for r in graph.with_bases(step.reads):
            read_at.setdefault(r, n + j)
    for c, node in enumerate(graph.nodes):
        if node.flops or wanted[c + 1:, c].any():
            continue
        ancestors = _remade_from(graph, wanted, c)
        if len(ancestors) >= 2:
            wanted = wanted.copy()
            wanted[c + 1:, c] = True
            for a in ancestors:
                wanted[c + 1:read_at.get(a, graph.stages), a] = False
            return wanted
    return wanted


def _remade_from(graph: Graph, wanted: np.ndarray, c: int) -> set[int]:
    """A_c: the kept values that free op c is remade from, through free ops only."""
    ancestors, seen, stack = set(), set(), list(graph.nodes[c].deps)
    while stack:
        a = stack.pop()
        if a in seen:
            continue
        seen.add(a)
        if wanted[a + 1:, a].any():
            ancestors.add(a)
        elif not graph.nodes[a].flops:
            stack.extend(graph.nodes[a].deps)
    return ancestors


def _replayed(graph: Graph, wanted: np.ndarray, overflow: int) -> np.ndarray:
    """Keep the first free op c, not kept, whose costly kept values P_c (those of A_c that cost
    FLOPs to remake and backward reads) hold at least ``overflow`` bytes more than c, in place of
    them: each p in P_c is out from its computation until the first backward step that reads one of
    P_c, which replays them once (a segment, as ``from_keep`` replays one), then kept until its last
    read. |P_c| remakes pay for Σ size_p - size_c bytes over all of forward and most of backward."""
    first_read, last_read = {}, {}
    for j, step in enumerate(graph.steps):
        for r in graph.with_bases(step.reads):
            first_read.setdefault(r, graph.n + j)
            last_read[r] = graph.n + j
    for c, node in enumerate(graph.nodes):
        if node.flops or wanted[c + 1:, c].any():
            continue
        costly = [p for p in _remade_from(graph, wanted, c)
                  if p in first_read and np.isfinite(_bytes_a_flop(graph, p))]
        if sum(graph.nodes[p].size for p in costly) - node.size >= overflow:
            replay = min(first_read[p] for p in costly)
            wanted = wanted.copy()
            wanted[c + 1:, c] = True
            for p in costly:
                wanted[p + 1:replay + 1, p] = False
                wanted[replay + 1:last_read[p] + 1, p] = True
            return wanted
    return wanted


def _swapped(graph: Graph, best: Schedule, wanted: np.ndarray, t: int) -> tuple[Schedule, np.ndarray] | None:
    """Keep the free op c that backward stage t reads and remakes, from its computation on, in
    place of its kept inputs that cost FLOPs: each out from c's computation until its next use
    after t (remade there, once). At t, c is held instead of the inputs it was remade from."""
    if t < graph.n:
        return None
    remade = [c for c in sorted(graph.with_bases(graph.steps[t - graph.n].reads))
              if best.R[t, c] and not graph.nodes[c].flops and not wanted[t, c]]
    if not remade:
        return None
    c = remade[0]
    inputs = [a for a in graph.nodes[c].deps if wanted[t, a] and np.isfinite(_bytes_a_flop(graph, a))]
    if not inputs:
        return None
    wanted = wanted.copy()
    wanted[c + 1:t + 1, c] = True
    for a in inputs:
        wanted[c + 1:_next_use(graph, best, a, t + 1) + 1, a] = False
    return complete(graph, wanted, "keep costly"), wanted


def _bytes_a_flop(graph: Graph, v: int) -> float:
    """size_v / f_v: what keeping v costs a FLOP of remaking it saved, f_v its FLOPs and those of
    the one-input ops it is made from alone (relu(matmul): the matmul's); a free op: infinite."""
    size, flops = graph.nodes[v].size, graph.nodes[v].flops
    while not flops and len(graph.nodes[v].deps) == 1:
        v = graph.nodes[v].deps[0]
        flops = graph.nodes[v].flops
    return size / flops if flops else float("inf")


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
