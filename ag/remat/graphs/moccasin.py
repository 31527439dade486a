"""Moccasin (Bartan, Li, Teague, Lott and Dilkina, ICML 2023): Checkmate's problem as constraint
programming, solved by OR-Tools' CP-SAT. Each node's value lives in at most C retention
intervals, one per computation: O(n C) integer variables against the MILP's O(n²) Booleans, and
the memory is one cumulative constraint over the intervals.

Time is Checkmate's stages cut into n + 2 instants each (``model`` says what a stage does):
B_t = t (n + 2) is stage t's boundary (what crosses it is kept into the stage, S), B_t + 1 + k
the slot where stage t may compute node k (in forward order, as ``model`` computes), and
B_t + n + 1 its backward step.

Variables, for node v and interval i = 1 .. C_v:

    a[v, i] ∈ {0, 1}     v is computed for the i-th time
    stage[v, i] ∈ ℤ      the stage that computes it: the interval starts at s[v, i] = B_stage + 1 + v
    e[v, i] ∈ ℤ          the instant v is freed: its value lives in [s[v, i], e[v, i])
    I[v, i]              that interval, of height size_v, present iff a[v, i]

    minimise   Σ_v Σ_{i ≥ 2} flops_v · a[v, i]
    subject to
      first:        a[v, 1] = 1, stage[v, 1] = v                  (stage v makes node v)
      order:        a[v, i+1] ≤ a[v, i];  e[v, i] ≤ B_stage[v, i+1]  (not kept into the stage that remakes it)
      precedence:   for each computation (k, j) and input d of k, one interval i of d holds its slot:
                    stage[d, i] ≤ stage[k, j] and e[d, i] > s[k, j]
      backward:     for each node r that step t reads, one interval of r holds B_t + n + 1
      views:        each interval of a view lies in one of its base's
      memory:       cumulative(I, the workspace at each s, the closures' arrays, the grads, each
                    step's transient bytes) ≤ budget - leaves

Every instant the model prices (a computation, a backward step) is an instant of the cumulative,
with the same bytes, so the same budget means the same thing to both solvers, and a solution read
back as R and S (``simulate``) fits it.

When C suffices: C_v = need_until(v) - v + 1 (the stages that may compute v). A stage computes a
node at most once, so with that many every Checkmate schedule is an assignment of these variables
and the optima are equal. With fewer, the optimum is over the schedules that compute no node more
than C times, and only then is CP-SAT's bound a bound for every schedule (C = 1: no recomputation).
The covering bound (``bounds.recompute_lower_bound``) is one for every C: the objective is
constrained to it, and a warm start that meets it is optimal with no search.
"""
from __future__ import annotations

import time

import numpy as np

from .bounds import carry_bound_bytes, recompute_lower_bound
from .checkmate import WARM_SHARE, NoScheduleFits, need_until, read_back_seconds, warm_starts, with_bound
from .highs import OutOfTime, check_deadline
from .graph import Graph
from .model import prune
from .schedule import Schedule, cheapest_within


def moccasin(graph: Graph, budget_bytes: int, *, intervals: int = 2, time_limit: float = 60) -> Schedule:
    """The fewest recomputed FLOPs, computing no node more than ``intervals`` times, whose peak
    (under ``model``) fits ``budget_bytes``; within ``time_limit`` seconds of wall time, building
    included, warm-started from the best heuristic schedule that fits.

    ``status`` is "optimal" only when proved among all schedules; ``interval_bound`` is CP-SAT's
    bound among schedules of at most ``intervals`` computations a node, ``lower_bound`` and
    ``gap`` the bound for every schedule; ``found_by`` says whether CP-SAT or a warm start made it."""
    start = time.perf_counter()  # the clock runs from the call: importing OR-Tools counts
    cp_model = _cp_model()
    budget = _checked(graph, budget_bytes, intervals, time_limit)
    deadline = start + time_limit
    # keep_costly: its free ops remade more than C times, a schedule C intervals cannot state
    warm = warm_starts(graph, budget, deadline, enough=start + WARM_SHARE * time_limit, remake_free=True)
    cover = recompute_lower_bound(graph, budget, min(deadline, time.perf_counter() + BOUND_SHARE * time_limit))
    solve_by = deadline - read_back_seconds(graph, warm, time_limit)
    found, interval_bound, proved, infeasible = None, None, False, False
    if not (warm and warm[0].recompute_flops <= cover):  # else the warm start is proved optimal
        try:
            program = _Program(graph, budget, intervals, cp_model, solve_by)
            program.at_least(cover)
            program.hint(warm)
            found, interval_bound, proved = program.solve(solve_by)
            infeasible = program.infeasible
        except OutOfTime:
            pass
    seconds = time.perf_counter() - start
    best = cheapest_within([found, *warm], budget)
    if best is None and infeasible:
        suffice = intervals_that_suffice(graph)
        raise NoScheduleFits(f"moccasin: CP-SAT proved that no schedule computing each node at most {intervals} "
                             f"time(s) fits {budget:,} bytes, and no warm start fits; raise intervals "
                             f"({suffice} hold every schedule) or the budget", None if intervals >= suffice else intervals)
    if best is None:
        raise TimeoutError(f"moccasin: the time limit of {time_limit} s ended before CP-SAT found any schedule "
                           f"for {graph.n} nodes at {budget:,} bytes, and no warm start fits; raise time_limit")
    found_by = "CP-SAT" if best is found else f"warm start ({best.planner})"
    schedule = _reported(graph, best, budget, seconds, intervals, interval_bound, proved and best is found, cover)
    schedule.found_by = found_by
    return schedule


BOUND_SHARE = 0.2  # of the time limit at most, for the bound: it returns once its programs are solved


def _cp_model():
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        raise ImportError("moccasin needs OR-Tools' CP-SAT: pip install 'ag[solver]'") from None
    return cp_model


def _checked(graph: Graph, budget_bytes: int, intervals: int, time_limit: float) -> int:
    """The budget as an int, once the arguments are known to make sense."""
    if not isinstance(graph, Graph):
        raise TypeError(f"moccasin: expected a Graph from remat.capture, got {type(graph).__name__}")
    if not graph.steps:
        raise ValueError("moccasin: the graph has no backward step (nothing requires grad): there is nothing to schedule")
    if not (isinstance(intervals, (int, np.integer)) and intervals >= 1):
        raise ValueError(f"moccasin: intervals must be an integer of at least 1 (1: no recomputation), got {intervals!r}")
    if not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise ValueError(f"moccasin: time_limit must be a positive number of seconds, got {time_limit!r}")
    budget, floor = int(budget_bytes), carry_bound_bytes(graph)
    if budget < floor:
        raise NoScheduleFits(f"moccasin: no schedule fits {budget:,} bytes; the smallest feasible budget is at least "
                             f"{floor:,} bytes (a stage needs that much to make or hold what it reads)")
    return budget


def intervals_that_suffice(graph: Graph) -> int:
    """The C with which Moccasin's optimum is Checkmate's: the most stages that may compute one node."""
    until = need_until(graph)
    return max(until[v] - v + 1 for v in range(graph.n))


def _reported(graph: Graph, best: Schedule, budget: int, seconds: float, intervals: int,
              interval_bound: float | None, proved: bool, cover: float) -> Schedule:
    """``best`` as moccasin's answer, with its bounds: CP-SAT's among C-interval schedules, and
    for every schedule (the covering bound ``cover``, or CP-SAT's own when C suffices)."""
    schedule = best  # relabelled, not rebuilt: it was made in this call, and ``simulate`` costs time
    schedule.planner, schedule.budget_bytes, schedule.status, schedule.solve_seconds = ("moccasin", budget, "feasible",
                                                                                       seconds)
    suffices = intervals >= intervals_that_suffice(graph)
    schedule.intervals = intervals
    proved = proved or schedule.recompute_flops <= cover
    schedule.interval_bound = float(schedule.recompute_flops) if proved else interval_bound
    schedule.proved_within_intervals = proved
    with_bound(schedule, max(cover, schedule.interval_bound or 0.0) if suffices else cover)
    if schedule.gap == 0:
        schedule.status = "optimal"
    return schedule


class _Program:
    """Moccasin's variables and constraints in a CP-SAT model."""

    def __init__(self, graph: Graph, budget: int, intervals: int, cp_model, deadline: float) -> None:
        self.graph, self.cp, self.deadline = graph, cp_model, deadline
        self.n, self.T = graph.n, graph.stages
        self.width = self.n + 2
        self.horizon = self.T * self.width
        self.model = cp_model.CpModel()
        until = need_until(graph)
        self.C = [min(intervals, until[v] - v + 1) for v in range(self.n)]
        self.a, self.stage, self.e, self.covers = [], [], [], {}
        self.infeasible = False
        for v in range(self.n):
            check_deadline(deadline)
            self._intervals(v, until[v])
        self._precedence()
        self._backward_steps()
        self._views()
        self._memory(budget)
        self.objective = sum(graph.nodes[v].flops * a for v in range(self.n) for a in self.a[v][1:])
        self.model.minimize(self.objective)

    def B(self, t):
        return self.width * t

    def s(self, v: int, i: int):
        return self.width * self.stage[v][i] + 1 + v

    def _intervals(self, v: int, until: int) -> None:
        """first and order: a[v, ·], stage[v, ·] and e[v, ·]."""
        m = self.model
        a = [m.new_constant(1)] + [m.new_bool_var(f"a[{v},{i}]") for i in range(1, self.C[v])]
        stage = [m.new_constant(v)] + [m.new_int_var(v + 1, until, f"stage[{v},{i}]") for i in range(1, self.C[v])]
        e = [m.new_int_var(self.B(v) + 2 + v, self.horizon, f"e[{v},{i}]") for i in range(self.C[v])]
        self.a.append(a)
        self.stage.append(stage)
        self.e.append(e)
        for i in range(self.C[v]):
            m.add(e[i] >= self.s(v, i) + 1)
        for i in range(1, self.C[v]):
            m.add_implication(a[i], a[i - 1])
            m.add(e[i - 1] <= self.width * stage[i]).only_enforce_if(a[i])
            m.add(stage[i] >= stage[i - 1] + 1).only_enforce_if(a[i])
            m.add(stage[i] == v + 1).only_enforce_if(~a[i])  # an absent interval: one value, no symmetry
            m.add(e[i] == self.s(v, i) + 1).only_enforce_if(~a[i])

    def _held(self, key, d: int, present, stage_at_most, instant_before) -> None:
        """One interval i of d holds an instant: Σ_i covers = present; covers ⇒ a[d, i],
        stage[d, i] ≤ stage_at_most and e[d, i] > instant_before."""
        m, covers = self.model, []
        for i in range(self.C[d]):
            x = m.new_bool_var(f"covers{key}[{d},{i}]")
            m.add_implication(x, self.a[d][i])
            m.add(self.stage[d][i] <= stage_at_most).only_enforce_if(x)
            m.add(self.e[d][i] >= instant_before + 1).only_enforce_if(x)
            covers.append(x)
            self.covers[key + (d, i)] = x
        m.add(sum(covers) == present)

    def _precedence(self) -> None:
        g = self.graph
        for k in range(self.n):
            for j in range(self.C[k]):
                check_deadline(self.deadline)  # each j: with C in the hundreds one k takes seconds
                for d in sorted(g.with_bases(g.nodes[k].deps)):
                    self._held(("compute", k, j), d, self.a[k][j], self.stage[k][j], self.s(k, j))

    def _backward_steps(self) -> None:
        g, n = self.graph, self.n
        for step_index, step in enumerate(g.steps):
            check_deadline(self.deadline)
            t = n + step_index
            for r in sorted(g.with_bases(step.reads)):
                self._held(("backward", t), r, 1, t, self.B(t) + n + 1)

    def _views(self) -> None:
        m, g = self.model, self.graph
        for v, node in enumerate(g.nodes):
            if node.view_of is None:
                continue
            b = node.view_of
            for j in range(self.C[v]):
                check_deadline(self.deadline)
                inside = []
                for i in range(self.C[b]):
                    x = m.new_bool_var(f"inside[{v},{j}][{b},{i}]")
                    m.add_implication(x, self.a[b][i])
                    m.add(self.stage[b][i] <= self.stage[v][j]).only_enforce_if(x)
                    m.add(self.e[b][i] >= self.e[v][j]).only_enforce_if(x)
                    inside.append(x)
                    self.covers[("view", v, j, b, i)] = x
                m.add(sum(inside) == self.a[v][j])

    def _memory(self, budget: int) -> None:
        """cumulative over the values' intervals and the fixed bytes of the model, instant by instant."""
        m, g = self.model, self.graph
        intervals, demands = [], []
        for v, node in enumerate(g.nodes):
            check_deadline(self.deadline)
            for i in range(self.C[v]):
                if node.size:
                    length = m.new_int_var(1, self.horizon, f"length[{v},{i}]")
                    intervals.append(m.new_optional_interval_var(self.s(v, i), length, self.e[v][i], self.a[v][i],
                                                                 f"I[{v},{i}]"))
                    demands.append(node.size)
                if node.workspace_bytes:
                    intervals.append(m.new_optional_fixed_size_interval_var(self.s(v, i), 1, self.a[v][i], ""))
                    demands.append(node.workspace_bytes)
        for start, end, size in self._fixed_bytes():
            intervals.append(m.new_fixed_size_interval_var(start, end - start, ""))
            demands.append(size)
        m.add_cumulative(intervals, demands, budget - g.leaf_bytes)

    def _fixed_bytes(self):
        """(from, to, bytes) that no schedule changes: each closure's arrays from its node's first
        computation to its backward step, each backward stage's grads, each step's transient bytes."""
        g, n = self.graph, self.n
        step_stage = {step.node: n + j for j, step in enumerate(g.steps)}
        for v, node in enumerate(g.nodes):
            if node.hidden_bytes:
                end = self.B(step_stage[v]) + n + 2 if v in step_stage else self.horizon
                yield self.B(v) + 1 + v, end, node.hidden_bytes
        for j, step in enumerate(g.steps):
            t = n + j
            if step.grad_bytes:
                yield self.B(t), self.B(t + 1), step.grad_bytes
            if step.extra_bytes:
                yield self.B(t) + n + 1, self.B(t) + n + 2, step.extra_bytes

    def at_least(self, bound: float) -> None:
        """A redundant constraint: the objective is at least a bound valid for every schedule
        (CP-SAT's own bound starts there; rounded down against HiGHS' tolerances)."""
        floor = int(bound * (1 - 1e-6))
        if floor > 0:
            self.model.add(self.objective >= floor)

    def hint(self, schedules: list[Schedule]) -> None:
        """CP-SAT's warm start: the first of ``schedules`` that computes no node more than C times."""
        for schedule in schedules:
            check_deadline(self.deadline)
            values = self._assignment(schedule)
            if values is not None:
                for var, value in values.items():
                    self.model.add_hint(var, value)
                return

    def _assignment(self, schedule: Schedule) -> dict | None:
        """The variables' values that spell ``schedule`` (pruned), or None if it needs more intervals."""
        R, S = prune(self.graph, schedule.R, schedule.S)
        lives = [_lives(self.graph, R, S, v, self.width) for v in range(self.n)]
        if any(len(lives[v]) > self.C[v] for v in range(self.n)):
            return None
        values = {}
        for v in range(self.n):
            for i in range(1, self.C[v]):
                present = i < len(lives[v])
                stage, _, end = lives[v][i] if present else (v + 1, 0, self.width * (v + 1) + 2 + v)
                values.update({self.a[v][i]: int(present), self.stage[v][i]: stage, self.e[v][i]: end})
            values[self.e[v][0]] = lives[v][0][2]
        for key, x in self.covers.items():
            values[x] = int(_covered(key, lives, self.width))
        return values

    def solve(self, deadline: float) -> tuple[Schedule | None, float | None, bool]:
        """(the best schedule CP-SAT found or None, its bound on recompute, whether it proved it optimal)."""
        remaining = deadline - time.perf_counter()
        if remaining <= 0.01:
            raise OutOfTime
        solver = self.cp.CpSolver()
        solver.parameters.max_time_in_seconds = remaining
        status = solver.solve(self.model)
        self.infeasible = status == self.cp.INFEASIBLE
        if self.infeasible:
            return None, None, False
        bound = max(0.0, float(solver.best_objective_bound)) if status != self.cp.UNKNOWN else None
        if status not in (self.cp.OPTIMAL, self.cp.FEASIBLE):
            return None, bound, False
        R, S = self._matrices(solver)
        found = Schedule(self.graph, *prune(self.graph, R, S), "moccasin")
        return found, bound, status == self.cp.OPTIMAL

    def _matrices(self, solver) -> tuple[np.ndarray, np.ndarray]:
        """R[stage, v] for each present interval; S[t, v] for each boundary B_t it crosses."""
        R = np.zeros((self.T, self.n), dtype=bool)
        S = np.zeros((self.T, self.n), dtype=bool)
        for v in range(self.n):
            for i in range(self.C[v]):
                if solver.boolean_value(self.a[v][i]) if i else True:
                    t, end = solver.value(self.stage[v][i]), solver.value(self.e[v][i])
                    R[t, v] = True
                    S[t + 1:(end - 1) // self.width + 1, v] = True
        return R, S


def _lives(graph: Graph, R: np.ndarray, S: np.ndarray, v: int, width: int) -> list[tuple[int, int, int]]:
    """(stage, start, end) of each computation of v in a pruned schedule: v lives while S keeps it
    and, in its last stage, until the instant after its last use there (a base's uses include its
    views', as ``with_bases`` counts them, so it outlives them)."""
    n, T = graph.n, graph.stages
    lives = []
    for t in np.flatnonzero(R[:, v]).tolist():
        u = t
        while u + 1 < T and S[u + 1, v]:
            u += 1
        last = 1 + v if u == t else 0
        for k in np.flatnonzero(R[u]).tolist():
            if v in graph.with_bases(graph.nodes[k].deps):
                last = max(last, 1 + k)
        if u >= n and v in graph.with_bases(graph.steps[u - n].reads):
            last = n + 1
        lives.append((t, width * t + 1 + v, width * u + last + 1))
    return lives


def _covered(key: tuple, lives: list, width: int) -> bool:
    """Whether, in ``lives``, the covering variable named ``key`` is 1: interval i of d is the
    one that holds the instant the key names."""
    if key[0] == "backward":
        _, t, d, i = key
        instant = width * t + width - 1
    else:
        _, k, j, d, i = key
        if j >= len(lives[k]):
            return False
        instant = lives[k][j][1]
    held = [life for life in lives[d] if life[1] < instant < life[2]]
    if key[0] == "view":
        held = [life for life in lives[d] if life[1] < instant and life[2] >= lives[k][j][2]]
    return i < len(lives[d]) and held[:1] == [lives[d][i]]
