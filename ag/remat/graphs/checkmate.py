"""Checkmate (Jain et al., MLSys 2020): the schedule that recomputes the fewest FLOPs under a
memory budget, as a mixed-integer linear program solved by HiGHS (``scipy.optimize.milp``).

Variables, for stage t and node i (``model`` says what a stage is):

    R[t, i] ∈ {0, 1}   node i is computed in stage t
    S[t, i] ∈ {0, 1}   node i is resident when stage t starts
    FREE[t, d, k] ∈ {0, 1}  node d is freed right after node k is computed in stage t
    U[t, k] ≥ 0        bytes alive right after node k is computed in stage t

    minimise   Σ_t Σ_i R[t, i] · flops_i
    subject to
      frontier:     R[t, t] = 1 and R[t, i] = 0 for i > t, S[t, i] = 0 for i ≥ t   (t < n)
      backward:     R[t, r] + S[t, r] ≥ 1 for each r the step of stage t reads     (t ≥ n)
      inputs:       R[t, i] ≤ R[t, p] + S[t, p] for each input p of i
      keeping:      S[t+1, i] ≤ S[t, i] + R[t, i];   R[t, i] + S[t, i] ≤ 1
      views:        S[t, v] ≤ S[t, base(v)]
      memory:       U[t, 0] = C_t + Σ_i size_i S[t, i] + size_0 R[t, 0]
                    U[t, k] = U[t, k-1] - Σ_d size_d FREE[t, d, k-1] + size_k R[t, k]
                    U[t, k] + workspace_k R[t, k] ≤ budget;  (backward) U[t, n] + extra_t ≤ budget
      freeing:      FREE[t, d, k] = R[t, k] · (1 - S[t+1, d]) · Π_{later users j of d} (1 - R[t, j]),
                    written as its linear bounds.

C_t is the leaves, the closures' arrays and the grads alive at that backward step.
``relax=True`` solves the LP relaxation instead and rounds it in two phases, as the paper's
approximation does: S is rounded at several thresholds, R is then whatever those S need
(``keep.complete``), and the cheapest rounding within the budget wins.

The MILP is solved after ``bounds.recompute_lower_bound`` (a covering program over a few instants: a
bound above 0 where the LP's is 0; a warm start that meets it needs no MILP) and the LP
relaxation, whose optimum bounds the recompute from below and whose rounding is an incumbent.
``time_limit`` is wall time from the call: one deadline that every phase spends from in turn
(importing the solver, the warm starts ``warm_starts`` until half of it once one fits, the
covering bound a tenth, building, the LP, its rounding, the MILP), the solve stopping early
enough to read its answer back (``read_back_seconds``). When it stops HiGHS (or the building),
the best of its schedule, the rounding and the warm starts (the fixed plans, DTR's evictions,
the chain planners on a chain) is returned as "feasible", with the gap to the best bound.
"""
from __future__ import annotations

import time

import numpy as np

from .bounds import carry_bound_bytes, lower_bound_bytes, recompute_lower_bound
from .dtr import GraphDTR
from .graph import Graph
from .highs import OutOfTime, check_deadline, highs_api, solve_by_deadline
from .chain_plans import chain_schedule
from .costly import keep_costly
from .keep import complete
from .nemo import nemo
from .model import Memory, ScheduleError, prune
from .schedule import Schedule, cheapest_within


class NoScheduleFits(ValueError):
    """A solver proved that no schedule fits the budget: among every schedule (``intervals`` None)
    or among those that compute each node at most ``intervals`` times."""

    def __init__(self, message: str, intervals: int | None = None) -> None:
        super().__init__(message)
        self.intervals = intervals


def _proved_infeasible(graph: Graph, budget: int) -> NoScheduleFits:
    return NoScheduleFits(f"checkmate: no schedule fits {budget:,} bytes (HiGHS proved it infeasible); "
                          f"the smallest feasible budget is at least {carry_bound_bytes(graph):,} bytes")



def checkmate(graph: Graph, budget_bytes: int, *, time_limit: float = 60, relax: bool = False) -> Schedule:
    """The fewest recomputed FLOPs whose peak (under ``model``) fits ``budget_bytes``."""
    start = time.perf_counter()  # the clock runs from the call: importing scipy counts
    highs = highs_api()
    budget = _checked(graph, budget_bytes, time_limit)
    deadline = start + time_limit
    warm = [] if relax else warm_starts(graph, budget, deadline, enough=start + WARM_SHARE * time_limit)
    # the covering bound in a tenth of the time: a warm start that meets it needs no MILP
    cover = 0.0 if relax else recompute_lower_bound(graph, budget, min(deadline, time.perf_counter() + 0.1 * time_limit))
    if warm and warm[0].recompute_flops <= cover:
        return _best_known(graph, warm, budget, time.perf_counter() - start, cover)
    solve_by = deadline - read_back_seconds(graph, warm, time_limit)
    try:
        program = _Program(graph, budget, solve_by)
        c, integrality, lb, ub, A, lo, hi = program.build(highs.sparse)
    except OutOfTime:
        return _stopped(graph, warm, budget, time_limit, time.perf_counter() - start, cover, "while building the MILP")
    problem = dict(c=c, bounds=highs.Bounds(lb, ub), constraints=highs.LinearConstraint(A, lo, hi))
    # the LP relaxation first: its rounding is an incumbent and its optimum a lower bound. Half
    # the time left at most, when the MILP follows: HiGHS reads its clock between iterations
    lp_by = time.perf_counter() + (0.8 if relax else 0.5) * (solve_by - time.perf_counter())
    lp = solve_by_deadline(highs.milp, lp_by, integrality=np.zeros_like(integrality), **problem,
                options={"time_limit": max(0.01, lp_by - time.perf_counter()), "disp": False})
    if lp.status == 2:
        raise _proved_infeasible(graph, budget)
    if relax:
        return _relaxed(graph, program, lp, budget, time_limit, start)
    rounded, bound = None, cover
    if lp.x is not None:
        bound = max(cover, program.unscale(lp.fun) - graph.forward_flops)
        rounding_by = time.perf_counter() + 0.25 * (solve_by - time.perf_counter())
        rounded = cheapest_within(_roundings(graph, program, lp.x, rounding_by), budget)
    if solve_by - time.perf_counter() < 0.01:
        return _stopped(graph, [rounded, *warm], budget, time_limit, time.perf_counter() - start, bound,
                        "while solving the LP relaxation")
    return _solved(graph, program, highs, problem, integrality, solve_by, [rounded, *warm], budget, time_limit,
                   start, bound)


WARM_SHARE = 0.5  # of the time limit, for the warm starts once one fits


def _checked(graph: Graph, budget_bytes: int, time_limit: float) -> int:
    """The budget as an int, once the arguments are known to make sense."""
    if not isinstance(graph, Graph):
        raise TypeError(f"checkmate: expected a Graph from remat.capture, got {type(graph).__name__}")
    if not graph.steps:
        raise ValueError("checkmate: the graph has no backward step (nothing requires grad): "
                         "there is nothing to schedule")
    if not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise ValueError(f"checkmate: time_limit must be a positive number of seconds, got {time_limit!r}")
    budget = int(budget_bytes)
    if budget < graph.leaf_bytes:
        raise NoScheduleFits(f"checkmate: a budget of {budget:,} bytes is below the {graph.leaf_bytes:,} bytes "
                             "that the inputs and parameters hold by themselves")
    floor = carry_bound_bytes(graph)
    if budget < floor:
        raise NoScheduleFits(f"checkmate: no schedule fits {budget:,} bytes; the smallest feasible budget is at "
                             f"least {floor:,} bytes (a stage needs that much to make or hold what it reads)")
    return budget


def _relaxed(graph: Graph, program: "_Program", lp, budget: int, time_limit: float, start: float) -> Schedule:
    """relax=True: the best rounding of the LP relaxation, with the LP's optimum as its bound."""
    if lp.x is None:
        raise TimeoutError(f"checkmate(relax=True): the time limit of {time_limit} s ended before the "
                           "LP relaxation was solved; raise time_limit")
    best = cheapest_within(_roundings(graph, program, lp.x, start + time_limit), budget)
    if best is None:
        raise ValueError(f"checkmate(relax=True): no rounding of the LP fits {budget:,} bytes; "
                         "use the MILP (relax=False) or a larger budget")
    best.budget_bytes, best.status, best.solve_seconds = budget, "feasible", time.perf_counter() - start
    return with_bound(best, max(0.0, program.unscale(lp.fun) - graph.forward_flops))


def _solved(graph: Graph, program: "_Program", highs, problem: dict, integrality, solve_by: float,
            incumbents: list, budget: int, time_limit: float, start: float, bound: float) -> Schedule:
    """The MILP until ``solve_by``; its schedule, or the best incumbent, with the best bound."""
    result = solve_by_deadline(highs.milp, solve_by, integrality=integrality, **problem,
                    options={"time_limit": max(0.01, solve_by - time.perf_counter()), "mip_rel_gap": 1e-9,
                             "disp": False})
    if result.x is None and result.status == 2:
        raise _proved_infeasible(graph, budget)
    dual = getattr(result, "mip_dual_bound", None)
    if dual is not None and np.isfinite(dual):
        bound = max(bound or 0.0, program.unscale(dual) - graph.forward_flops)
    schedule = None
    if result.x is not None:
        schedule = Schedule(graph, *prune(graph, *program.matrices(result.x)), "checkmate", budget,
                            "optimal" if result.status == 0 else "feasible")
        if schedule.status == "optimal":
            schedule.gap, schedule.lower_bound = 0.0, float(schedule.recompute_flops)
            schedule.solve_seconds = time.perf_counter() - start
            return schedule
    return _stopped(graph, [schedule, *incumbents], budget, time_limit, time.perf_counter() - start, bound,
                    "before HiGHS found any schedule")



def _stopped(graph: Graph, found: list, budget: int, time_limit: float, seconds: float,
             bound: float | None, doing: str) -> Schedule:
    """The time limit ended the solve: the best schedule known, or a clear error when none fits."""
    best = _best_known(graph, found, budget, seconds, bound)
    if best is None:
        raise TimeoutError(f"checkmate: the time limit of {time_limit} s ended {doing} for {graph.n} "
                           f"nodes at {budget:,} bytes, and neither LP rounding nor a warm start fits; "
                           "raise time_limit")
    return best


def _best_known(graph: Graph, found: list, budget: int, seconds: float,
                bound: float | None) -> Schedule | None:
    """Stopped by the time limit: the best of what the solver found and the warm starts that fit
    (the incumbents it started from), with the gap to the best bound."""
    best = cheapest_within(found, budget)
    if best is None:
        return None
    # relabelled, not rebuilt: every candidate was made in this call, and ``simulate`` costs time
    best.planner, best.budget_bytes, best.status, best.solve_seconds = "checkmate", budget, "feasible", seconds
    best = with_bound(best, bound)
    if best.gap == 0:
        best.status = "optimal"  # the bound proves it, though the solver did not finish
    return best


def warm_starts(graph: Graph, budget: int, deadline: float = float("inf"),
                enough: float = float("inf"), remake_free: bool = False) -> list[Schedule]:
    """The heuristic schedules that fit ``budget``, cheapest first: the fixed plans, DTR's evictions
    at a few budgets, on a chain the greedy and dynamic-programming chain plans and, if
    ``remake_free``, ``keep_costly``. Makes none after ``enough`` once one fits, and none after
    ``deadline``; a DTR run in progress is cut there. No remat first (it settles loose budgets), then
    keep_costly (it settles middle ones, in a quarter of the time left), then DTR at the budget."""
    dtr = [lambda until, f=f: dtr_schedule(graph, int(f * budget), deadline=until) for f in (1.0, 0.9, 0.8)]

    def costly(until: float) -> Schedule:  # a quarter of the time left: at tight budgets it may not fit
        return keep_costly(graph, budget, time.perf_counter() + (until - time.perf_counter()) / 4)
    makers = [lambda _: chain_schedule(graph, "keep all"), *([costly] if remake_free else []), dtr[0],
              lambda _: chain_schedule(graph, "keep none"),
              lambda _: chain_schedule(graph, "sqrt"), lambda _: nemo(graph, "selective"),
              lambda _: nemo(graph, "full"), *dtr[1:]]
    if all(node.deps in ((), (node.index - 1,)) for node in graph.nodes):
        makers += [lambda _, s=s: chain_schedule(graph, s, budget_bytes=budget) for s in ("greedy", "optimal")]
    found = []
    for make in makers:
        until = min(deadline, enough) if cheapest_within(found, budget) is not None else deadline
        if time.perf_counter() > until:
            break
        try:
            found.append(make(until))
        except ValueError:
            continue  # NeMo's modes need a transformer; a chain plan may not fit; DTR may not run
        except OutOfTime:
            break
    return sorted((s for s in found if s.predicted_peak_bytes <= budget), key=lambda s: s.recompute_flops)


def read_back_seconds(graph: Graph, warm: list[Schedule], time_limit: float) -> float:
    """What a solver keeps of its limit to read its answer back as a Schedule: twice what pruning
    and pricing the best warm start takes now, under the machine's load now; at least 2%."""
    if not warm:
        return 0.05 * time_limit
    start = time.perf_counter()
    Schedule(graph, *prune(graph, warm[0].R, warm[0].S), "a rehearsal")
    return min(0.25 * time_limit, max(0.02 * time_limit, 2 * (time.perf_counter() - start)))


class _Recording:
    """What DTR drives in place of ``execute``'s Run: nothing is computed; stage by stage it
    records what is resident when the stage starts (S) and what DTR computes in it (R)."""

    def __init__(self, graph: Graph, deadline: float = float("inf")) -> None:
        self.graph, self.resident, self.deadline = graph, set(), deadline
        self.R = np.zeros((graph.stages, graph.n), dtype=bool)
        self.S = np.zeros((graph.stages, graph.n), dtype=bool)
        self.t = -1
        self.memory = _StagedMemory(graph, self)

    def begin(self, t: int) -> None:
        check_deadline(self.deadline)
        self.t = t
        self.S[t, sorted(self.resident)] = True

    def compute(self, k: int) -> None:
        self.R[self.t, k] = True
        self.resident.add(k)
        self.memory.compute(k)

    def free(self, k: int) -> None:
        self.resident.discard(k)
        self.memory.free(k)

    def backward(self, j: int) -> None:
        self.memory.backward(j)


class _StagedMemory(Memory):
    def __init__(self, graph: Graph, recording: _Recording) -> None:
        super().__init__(graph)
        self.recording = recording

    def stage(self, t: int) -> None:
        super().stage(t)
        self.recording.begin(t)


def dtr_schedule(graph: Graph, budget: int, heuristic: str = "dtr_eq", deadline: float = float("inf")) -> Schedule:
    """DTR's run-time evictions at ``budget``, replayed without computing, as a schedule (a value
    evicted and recomputed within one stage is kept instead: a stage computes a node once).
    Raises OutOfTime if the replay is still running at ``deadline``."""
    recording = _Recording(graph, deadline)
    GraphDTR(graph, budget, heuristic, recording).run()
    try:
        return Schedule(graph, *prune(graph, recording.R & ~recording.S, recording.S), "dtr")
    except ScheduleError as error:
        raise ValueError(f"dtr_schedule: DTR's run is no schedule: {error}") from None


def with_bound(schedule: Schedule, bound: float | None) -> Schedule:
    """Attach the best lower bound on recompute known (none: the trivial 0) and the gap to it."""
    spent = schedule.recompute_flops
    schedule.lower_bound = min(bound or 0.0, spent)
    schedule.gap = 0.0 if spent == 0 else (spent - schedule.lower_bound) / spent
    return schedule



class _Program:
    """The MILP's variables, numbered, and its constraints as one sparse matrix."""

    def __init__(self, graph: Graph, budget: int, deadline: float = float("inf")) -> None:
        self.graph, self.budget, self.deadline = graph, budget, deadline
        T, n = graph.stages, graph.n
        self.T, self.n = T, n
        self.need_until = need_until(graph)
        self.backward_stage: list[int | None] = [None] * n
        for j, step in enumerate(graph.steps):
            self.backward_stage[step.node] = n + j
        self.count = 0
        self.R = np.full((T, n), -1, dtype=np.int64)
        self.S = np.full((T, n), -1, dtype=np.int64)
        for t in range(T):
            check_deadline(deadline)
            for i in range(n):
                if t > self.need_until[i]:
                    continue
                if t >= n or i <= t:
                    self.R[t, i] = self._new()
                if t >= 1 and (t >= n or i < t):
                    self.S[t, i] = self._new()
        self.binaries = self.count
        self.candidates = [sorted(graph.with_bases(node.deps) | {node.index}) for node in graph.nodes]
        self.readers: list[list[int]] = [[] for _ in range(n)]  # the nodes j with d in candidates[j], ascending
        for j in range(n):
            for d in self.candidates[j]:
                self.readers[d].append(j)
        self.FREE: dict[tuple[int, int, int], int] = {}
        for t in range(T):
            check_deadline(deadline)
            for k in range(n):
                if self.R[t, k] >= 0:
                    for d in self.candidates[k]:
                        self.FREE[t, d, k] = self._new()
        self.binaries = self.count
        self.U = np.arange(self.count, self.count + T * (n + 1)).reshape(T, n + 1)
        self.count += T * (n + 1)
        self.scale = max(1.0, max(node.flops for node in graph.nodes))  # objective near 1: HiGHS' tolerances are relative

    def _new(self) -> int:
        self.count += 1
        return self.count - 1

    def unscale(self, objective: float) -> float:
        return objective * self.scale

    def build(self, sparse):
        g, T, n = self.graph, self.T, self.n
        rows, cols, vals, lo, hi = [], [], [], [], []

        def row(entries, low, high):
            r = len(lo)
            for var, coef in entries:
                rows.append(r)
                cols.append(var)
                vals.append(coef)
            lo.append(low)
            hi.append(high)

        lb = np.zeros(self.count)
        ub = np.ones(self.count)
        ub[self.U.ravel()] = np.inf
        for t in range(min(T, n)):
            lb[self.R[t, t]] = 1  # frontier: stage t makes node t
        stages = []
        for t in range(T):
            check_deadline(self.deadline)
            step = t - n if t >= n else None
            reads = g.steps[step].reads if step is not None else ()
            for r in reads:
                row([(self.R[t, r], 1), (self.S[t, r], 1)], 1, np.inf)
            for i in range(n):
                Ri, Si = self.R[t, i], self.S[t, i]
                if Ri >= 0:
                    for p in g.nodes[i].deps:
                        entries = [(Ri, 1)] + [(v, -1) for v in (self.R[t, p], self.S[t, p]) if v >= 0]
                        row(entries, -np.inf, 0)
                    if Si >= 0:
                        row([(Ri, 1), (Si, 1)], -np.inf, 1)
                if t + 1 < T and self.S[t + 1, i] >= 0:
                    row([(self.S[t + 1, i], 1)] + [(v, -1) for v in (Si, Ri) if v >= 0], -np.inf, 0)
                base = g.nodes[i].view_of
                if Si >= 0 and base is not None:
                    row([(Si, 1)] + ([(self.S[t, base], -1)] if self.S[t, base] >= 0 else []), -np.inf, 0)
            self._memory(t, reads, row)
            stages.append(np.array([rows, cols, vals]))  # into NumPy stage by stage, between deadline checks
            rows.clear(), cols.clear(), vals.clear()
        c = np.zeros(self.count)
        made = self.R >= 0
        c[self.R[made]] = np.array([node.flops for node in g.nodes])[np.nonzero(made)[1]] / self.scale
        integrality = np.zeros(self.count, dtype=np.int8)
        integrality[:self.binaries] = 1
        rows, cols, vals = np.concatenate(stages, axis=1)
        A = sparse.csr_array((vals, (rows.astype(np.int64), cols.astype(np.int64))), shape=(len(lo), self.count))
        return c, integrality, lb, ub, A, np.array(lo, dtype=float), np.array(hi, dtype=float)

    def _memory(self, t: int, reads, row) -> None:
        g, n = self.graph, self.n
        step = t - n if t >= n else None
        const = g.leaf_bytes + g.hidden_bytes_at(t) + (g.steps[step].grad_bytes if step is not None else 0)
        read_set = g.with_bases(reads)
        budget = self.budget
        for k in range(n):
            U = self.U[t, k]
            entries = [(U, 1)]
            if k == 0:
                entries += [(self.S[t, i], -g.nodes[i].size) for i in range(n) if self.S[t, i] >= 0]
                low = high = const
            else:
                entries.append((self.U[t, k - 1], -1))
                entries += [(self.FREE[t, d, k - 1], g.nodes[d].size) for d in self.candidates[k - 1]
                            if (t, d, k - 1) in self.FREE]
                low = high = 0
            if k == t:  # the first computation of node t also makes its closure's arrays
                low = high = low + g.nodes[t].hidden_bytes
            if self.R[t, k] >= 0:
                entries.append((self.R[t, k], -g.nodes[k].size))
                row([(U, 1), (self.R[t, k], g.nodes[k].workspace_bytes)], -np.inf, budget)
            else:
                row([(U, 1)], -np.inf, budget)
            row(entries, low, high)
            if self.R[t, k] >= 0:
                self._free(t, k, read_set, row)
        last = self.U[t, n]
        entries = [(last, 1), (self.U[t, n - 1], -1)]
        entries += [(self.FREE[t, d, n - 1], g.nodes[d].size) for d in self.candidates[n - 1]
                    if (t, d, n - 1) in self.FREE]
        row(entries, 0, 0)
        if step is not None:
            row([(last, 1)], -np.inf, budget - g.steps[step].extra_bytes)

    def _free(self, t: int, k: int, read_set: set[int], row) -> None:
        """FREE[t, d, k] = R[t, k] · (1 - S[t+1, d]) · Π (1 - R[t, j]) over later users j of d."""
        T = self.T
        for d in self.candidates[k]:
            F = self.FREE[t, d, k]
            if d in read_set:  # the backward step at the end of this stage still reads it
                row([(F, 1)], -np.inf, 0)
                continue
            later = [self.R[t, j] for j in self.readers[d] if j > k and self.R[t, j] >= 0]
            keep = self.S[t + 1, d] if t + 1 < T else -1
            row([(F, 1), (self.R[t, k], -1)], -np.inf, 0)
            if keep >= 0:
                row([(F, 1), (keep, 1)], -np.inf, 1)
            for j in later:
                row([(F, 1), (j, 1)], -np.inf, 1)
            # and it is freed whenever nothing stops it
            hazards = [(self.R[t, k], -1)] + ([(keep, 1)] if keep >= 0 else []) + [(j, 1) for j in later]
            row([(F, 1)] + hazards, 0, np.inf)

    def matrices(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        R = np.zeros((self.T, self.n), dtype=bool)
        S = np.zeros((self.T, self.n), dtype=bool)
        on = x > 0.5
        R[self.R >= 0] = on[self.R[self.R >= 0]]
        S[self.S >= 0] = on[self.S[self.S >= 0]]
        return R, S

    def fractional_S(self, x: np.ndarray) -> np.ndarray:
        S = np.zeros((self.T, self.n))
        S[self.S >= 0] = x[self.S[self.S >= 0]]
        return S


def need_until(graph: Graph) -> list[int]:
    """The last stage in which each node can be needed: by a forward user, or to (re)compute
    something a backward step reads."""
    n = graph.n
    ancestors: list[set[int]] = []
    for node in graph.nodes:
        mine = {node.index}
        for d in graph.with_bases(node.deps):
            mine |= ancestors[d]
        ancestors.append(mine)
    until = [max([u for u in graph.users[i]], default=i) for i in range(n)]
    for j, step in enumerate(graph.steps):
        for r in graph.with_bases(step.reads):
            for a in ancestors[r]:
                until[a] = max(until[a], n + j)
    for i in range(n):  # a view needed keeps its base needed
        for v in graph.views(i):
            until[i] = max(until[i], until[v])
    return until


def _roundings(graph: Graph, program: _Program, x: np.ndarray, until: float) -> list[Schedule]:
    """Two-phase rounding: S at thresholds (and a few random draws), then the R they need; made
    until ``until`` (the first always)."""
    S_frac = program.fractional_S(x)
    rng = np.random.default_rng(0)
    candidates = [S_frac >= threshold for threshold in (0.5, 0.25, 0.75, 0.1, 0.9, 0.01, 0.99)]
    candidates += [rng.random(S_frac.shape) < S_frac for _ in range(8)]
    made = []
    for S_round in candidates:
        if made and time.perf_counter() > until:
            break
        made.append(complete(graph, S_round, "checkmate LP rounding"))
    return made

