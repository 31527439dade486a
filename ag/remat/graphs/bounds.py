"""Lower bounds that hold for every schedule: on the peak (``lower_bound_bytes``,
``carry_bound_bytes``) and on the FLOPs recomputed within a budget (``recompute_lower_bound``, a
covering program that HiGHS solves). A solver refuses a budget below the first two and reports its
gap against the third."""
from __future__ import annotations

import time

import numpy as np

from .graph import Graph
from .highs import OutOfTime, check_deadline, highs_api, solve_by_deadline


def lower_bound_bytes(graph: Graph) -> int:
    """No schedule peaks below this: every stage must at least hold what its own step reads."""
    return int(max(_stage_floors(graph)[2]))


def _stage_floors(graph: Graph) -> tuple[list[set[int]], list[int], list[int]]:
    """For each stage t's instant (computing node t; backward step t - n): held_t, the values its
    step reads (a node's inputs and itself); fixed_t, what every schedule holds then (leaves,
    hidden bytes, grads); floor_t, fixed_t + held_t + the step's own transient bytes."""
    n = graph.n
    held, fixed, floor = [], [], []
    for t in range(graph.stages):
        step = graph.steps[t - n] if t >= n else None
        node = graph.nodes[t] if step is None else None
        held.append(graph.with_bases(step.reads) if step else graph.with_bases(node.deps) | {t})
        fixed.append(graph.leaf_bytes + graph.hidden_bytes_at(t) + (step.grad_bytes if step else 0))
        floor.append(fixed[t] + sum(graph.nodes[i].size for i in held[t])
                     + (step.extra_bytes if step else node.hidden_bytes + node.workspace_bytes))
    return held, fixed, floor


def carry_bound_bytes(graph: Graph) -> int:
    """No schedule peaks below this either, and it is at least ``lower_bound_bytes``. Each stage t
    has one instant i_t in every schedule (computing node t; backward step t - n), holding at
    least floor_t (``lower_bound_bytes``' terms) and the set held_t. A value r that i_s reads was
    made by its last computation, in some stage t in [r, s], and held from there to i_s. Made in
    a stage t > r, that moment holds fixed_t (leaves, closures' arrays, grads) + r and its inputs
    + r's workspace; held, r adds size_r at each instant i_u, t ≤ u < s, u ≠ r, that floor_u
    leaves it out of. So the peak is at least

        max over s and r read at i_s of  min over t in [r, s] of max(make_t(r), carry_t(r, s)),
        carry_t(r, s) = max over t ≤ u < s, u ≠ r of floor_u + size_r [r ∉ held_u],

    make_r(r) = floor_r. Where a large value cannot be remade late (the grads have grown) nor held
    across a full instant, this is above ``lower_bound_bytes``."""
    T = graph.stages
    held, fixed, floor = _stage_floors(graph)
    floor_, fixed_ = np.array(floor, dtype=np.int64), np.array(fixed, dtype=np.int64)
    bound = int(floor_.max())
    for s in range(T):
        for r in held[s]:
            size = graph.nodes[r].size
            if not size or s == r:
                continue
            make = fixed_[r:s + 1] + size + graph.nodes[r].workspace_bytes \
                + sum(graph.nodes[d].size for d in graph.with_bases(graph.nodes[r].deps))
            make[0] = floor_[r]
            lacks = floor_[r:s] + size * np.array([r not in held[u] for u in range(r, s)])
            lacks[0] = 0  # instant r is the first making itself
            carry = np.append(np.maximum.accumulate(lacks[::-1])[::-1], 0)
            bound = max(bound, int(np.maximum(make, carry).min()))
    return bound


def _instants(graph: Graph, budget: int, deadline: float) -> list[tuple[int, set[int], int]]:
    """The instants every schedule has, as (index, the nodes it needs, the bytes it holds whatever
    the schedule, those nodes included): stage k computing node k (index k), backward step j
    (index n + j); only those that would not fit with every earlier node kept until its last use."""
    n, out = graph.n, []
    last = [-1] * n  # the last instant that needs each node
    for k, node in enumerate(graph.nodes):
        for d in graph.with_bases(node.deps):
            last[d] = max(last[d], k)
    for j, step in enumerate(graph.steps):
        for r in graph.with_bases(step.reads):
            last[r] = max(last[r], n + j)
    for k, node in enumerate(graph.nodes):
        out.append((k, graph.with_bases(node.deps) | {k}, graph.hidden_bytes_at(k) + node.hidden_bytes
                    + node.workspace_bytes))
    for j, step in enumerate(graph.steps):
        out.append((n + j, graph.with_bases(step.reads), graph.hidden_bytes_at(n + j) + step.grad_bytes
                    + step.extra_bytes))
    kept = []
    for index, needed, fixed in out:
        check_deadline(deadline)
        fixed += graph.leaf_bytes + sum(graph.nodes[i].size for i in needed)
        alive = [v for v in range(min(index, n)) if v not in needed and last[v] > index]
        if fixed + sum(graph.nodes[v].size for v in alive) > budget:
            kept.append((index, needed, fixed, alive))
    return kept


def recompute_lower_bound(graph: Graph, budget: int, deadline: float = float("inf"), instants: int = 24,
                          windows: int = 16) -> float:
    """No schedule within ``budget`` recomputes fewer FLOPs than this. For a few instants τ that
    every schedule has and that overflow if nothing is dropped (``_instants``), with
    x_v = "v is computed twice or more", h_{τ,u} = "u is resident at τ" and y_{τ,u} = "u is made
    before τ and computed again after it" (u made before τ):

        minimise Σ_v flops_v x_v   subject to, at each τ:
          memory:   fixed_τ + Σ_u size_u h_{τ,u} ≤ budget
          needed:   h_{τ,u} + y_{τ,u} ≥ 1 for u needed after τ;   y_{τ,u} ≤ x_u
          inputs:   h_{τ,d} + y_{τ,d} ≥ y_{τ,u} for each input d of u made before τ

    and, with the chosen τ_1 < … < τ_m cutting time into windows W_k = (τ_k, τ_{k+1}], r_{k,u} =
    "u is computed in W_k" and c_u = how often u is computed again (cost flops_v c_v, not x_v):

          windows:  r_{k,u} + h_{τ_k,u} ≥ 1 for u that an instant in W_k reads;
                    r_{k,d} + h_{τ_k,d} ≥ r_{k,u} for each input d of u;   c_u ≥ Σ_k r_{k,u},  c_u ≥ x_u

    Every schedule is a solution (an input of a computation after τ is resident at τ or computed
    after it; a value read in W_k and not resident at τ_k is computed in W_k, once per window), at
    a cost no more than its recompute; so the optimum, HiGHS' bound on it, or its LP optimum bounds
    every schedule. Any subset of instants keeps it valid: the ``instants`` that overflow most.
    ``_windowed_program`` also carries residency from window to window over the ``windows``
    instants that leave the least room (``_least_room``); the larger of the two bounds is returned."""
    highs = highs_api()
    try:
        overflowing = _instants(graph, budget, deadline)
        chosen = sorted(overflowing, key=lambda i: -i[2] - sum(graph.nodes[v].size for v in i[3]))
        if not chosen:
            return 0.0  # nothing overflows: the no-recompute schedule fits
        c, A, lo, upper = _covering_program(graph, chosen[:instants], budget, highs.sparse, deadline)
    except OutOfTime:
        return 0.0  # the trivial bound
    problem = dict(bounds=highs.Bounds(0, upper), constraints=highs.LinearConstraint(A, lo, np.inf))
    lp = solve_by_deadline(highs.milp, deadline, c, integrality=np.zeros(len(c)), **problem)
    if lp.status == 2:
        return float("inf")  # a budget below ``lower_bound_bytes``: no schedule fits
    bound = float(lp.fun) if lp.x is not None else 0.0
    tightest = _least_room(overflowing, windows)
    windowed = [lambda: (*_windowed_program(graph, tightest, budget, highs.sparse, deadline), 1)]
    for program in [lambda: (c, A, lo, upper)] + (windowed if windows else []):
        remaining = deadline - time.perf_counter()
        if remaining <= 0.01:
            break
        try:
            c_, A_, lo_, upper_ = program()
        except OutOfTime:
            break
        result = solve_by_deadline(highs.milp, deadline, c_, integrality=np.ones(len(c_)), bounds=highs.Bounds(0, upper_),
                        constraints=highs.LinearConstraint(A_, lo_, np.inf),
                        options={"time_limit": max(0.01, deadline - time.perf_counter()), "disp": False})
        dual = getattr(result, "mip_dual_bound", None)  # not ``fun``: HiGHS stops within a relative gap
        if dual is not None and np.isfinite(dual):
            bound = max(bound, float(dual))
    return max(0.0, bound)


def _least_room(instants: list, count: int) -> list:
    """The ``count`` instants whose fixed bytes leave a schedule the least room, in time order:
    what it must carry from one to the next is priced where holding it costs most."""
    return sorted(sorted(instants, key=lambda i: i[2])[-count:], key=lambda i: i[0])


class _Rows:
    """A sparse program's constraints A z ≥ lo, written a row at a time: ``row([(column, coefficient), …], lo)``."""

    def __init__(self) -> None:
        self.rows, self.cols, self.vals, self.lo = [], [], [], []

    def __call__(self, entries, low) -> None:
        for col, val in entries:
            self.rows.append(len(self.lo))
            self.cols.append(col)
            self.vals.append(val)
        self.lo.append(low)

    def matrix(self, sparse, count: int) -> tuple:
        """(A, lo) with ``count`` columns."""
        return (sparse.csr_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.lo), count)),
                np.array(self.lo, dtype=float))


def _windowed_program(graph: Graph, chosen: list, budget: int, sparse, deadline: float) -> tuple:
    """(c, A, lo), A z ≥ lo, of the covering program with remakes counted window by window. For
    instants τ_1 < … < τ_K (``chosen``, in order) and the windows W_k = (τ_k, τ_{k+1}] (W_K runs
    to the end), with h_{k,u} = "u is resident at τ_k" and z_{k,u} = "u is computed in W_k"
    (u made before τ_k, so a remake):

        minimise Σ_k Σ_u flops_u z_{k,u}   subject to
          memory:  fixed_k + Σ_u size_u h_{k,u} ≤ budget;   needed: h_{k,u} = 1 for u τ_k reads
          kept:    h_{k,u} + z_{k,u} ≥ h_{k+1,u}   (resident at τ_{k+1}: at τ_k, or made in W_k)
          used:    h_{k,u} + z_{k,u} ≥ 1 for u read at an instant inside W_k
          inputs:  h_{k,d} + z_{k,d} ≥ z_{k,u} for each input d of u

    A schedule is a solution, at a cost no more than its recompute: a value read in W_k was
    resident at τ_k or computed in W_k before the read (so were a computation's inputs)."""
    n, row = graph.n, _Rows()
    reads = [_reads(graph, t) for t in range(graph.stages)]
    made = [range(min(index, n)) for index, *_ in chosen]
    h, count = [], 0
    for before in made:
        h.append({u: count + i for i, u in enumerate(before)})
        count += len(before)
    z = []
    for before in made:
        z.append({u: count + i for i, u in enumerate(before)})
        count += len(before)
    ends = [index for index, *_ in chosen[1:]] + [len(reads)]
    for k, (index, needed, fixed, _) in enumerate(chosen):
        check_deadline(deadline)
        row([(h[k][u], -graph.nodes[u].size) for u in made[k] if u not in needed], fixed - budget)
        read_inside = set().union(*reads[index + 1:ends[k]])
        for u in made[k]:
            if u in needed:
                row([(h[k][u], 1)], 1)
            if u in read_inside:
                row([(h[k][u], 1), (z[k][u], 1)], 1)
            if k + 1 < len(chosen):
                row([(h[k][u], 1), (z[k][u], 1), (h[k + 1][u], -1)], 0)
            for d in graph.with_bases(graph.nodes[u].deps):
                row([(h[k][d], 1), (z[k][d], 1), (z[k][u], -1)], 0)
    c = np.zeros(count)
    for zk in z:
        c[list(zk.values())] = [graph.nodes[u].flops for u in zk]
    return (c, *row.matrix(sparse, count))


def _covering_program(graph: Graph, chosen: list, budget: int, sparse, deadline: float) -> tuple:
    """(c, A, lo, upper) of ``recompute_lower_bound``'s program, A x ≥ lo, x ≤ upper: x first, then
    h and y per instant, r per window, c last."""
    n, row = graph.n, _Rows()
    count, resident = n, {}
    for index, needed, fixed, alive in chosen:
        check_deadline(deadline)
        made = range(min(index, n))
        h = {u: count + 2 * i for i, u in enumerate(made)}
        y = {u: count + 2 * i + 1 for i, u in enumerate(made)}
        count += 2 * len(made)
        row([(h[u], -graph.nodes[u].size) for u in made if u not in needed], fixed - budget)
        for u in made:
            row([(h[u], 1), (y[u], 1)], 1 if u in needed or u in alive else 0)
            row([(u, 1), (y[u], -1)], 0)
            for d in graph.with_bases(graph.nodes[u].deps):
                row([(h[d], 1), (y[d], 1), (y[u], -1)], 0)
        resident[index] = h
    made_again: dict[int, list[int]] = {u: [] for u in range(n)}
    order = sorted(chosen, key=lambda i: i[0])
    for k, (index, needed, _, _) in enumerate(order):
        check_deadline(deadline)
        end = order[k + 1][0] if k + 1 < len(order) else graph.stages - 1
        read = set().union(*(_reads(graph, t) for t in range(index + 1, end + 1)))
        h = resident[index]
        r = {u: count + i for i, u in enumerate(u for u in h if u not in needed)}
        count += len(r)
        for u, r_u in r.items():
            made_again[u].append(r_u)
            if u in read:
                row([(r_u, 1), (h[u], 1)], 1)
            for d in graph.with_bases(graph.nodes[u].deps):
                if d in r:
                    row([(r[d], 1), (h[d], 1), (r_u, -1)], 0)
    c = np.zeros(count + n)
    c[count:] = [node.flops for node in graph.nodes]
    for u in range(n):
        row([(count + u, 1), *((r_u, -1) for r_u in made_again[u])], 0)
        row([(count + u, 1), (u, -1)], 0)
    upper = np.ones(count + n)
    upper[count:] = [max(1, len(made_again[u])) for u in range(n)]
    return (c, *row.matrix(sparse, count + n), upper)


def _reads(graph: Graph, t: int) -> set[int]:
    """What instant t reads in every schedule: node t's inputs, or backward step t - n's reads."""
    if t < graph.n:
        return graph.with_bases(graph.nodes[t].deps)
    return graph.with_bases(graph.steps[t - graph.n].reads)
