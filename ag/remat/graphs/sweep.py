"""Checkmate's Figure 4 on ag: every planner on one captured graph, across budgets, each point
measured by running it (``execute`` for schedules, the run itself for DTR)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .checkmate import checkmate, lower_bound_bytes
from .dtr import dynamic_graph
from .execute import execute
from .graph import Graph
from .chain_plans import chain_plans, chain_schedule, fitting
from .nemo import nemo


@dataclass(frozen=True)
class Point:
    """One planner at one budget (None: a plan that takes no budget), predicted and measured."""

    planner: str  # "checkpoint all" keeps every value backward reads; "recompute all" keeps none
    budget_bytes: int | None
    predicted_peak_bytes: int
    peak_bytes: int
    recompute_flops: int
    status: str = "heuristic"
    gap: float | None = None
    solve_seconds: float = 0.0


FIXED = ("checkpoint all", "recompute all", "sqrt", "uniform (2)", "block (half)", "selective", "full")
BUDGETED = ("MILP", "LP rounding", "DTR", "greedy", "one-level optimal")


def budgets_between(graph: Graph, points: int = 5) -> list[int]:
    """``points`` budgets from the smallest feasible bound to the no-recompute peak."""
    top = chain_schedule(graph, "keep all").predicted_peak_bytes
    return [int(b) for b in np.linspace(lower_bound_bytes(graph), top, points)]


def sweep(graph: Graph, budgets: Sequence[int] | None = None, *, time_limit: float = 10,
          planners: Sequence[str] = FIXED + BUDGETED) -> list[Point]:
    """Run every planner in ``planners`` (fixed plans once, the others at each budget) and
    return what each predicted and measured; a planner that finds nothing at a budget is left out."""
    budgets = budgets_between(graph) if budgets is None else list(budgets)
    points = []
    fixed = {"checkpoint all": lambda: chain_schedule(graph, "keep all"),
             "recompute all": lambda: chain_schedule(graph, "keep none"),
             "sqrt": lambda: chain_schedule(graph, "sqrt"),
             "uniform (2)": lambda: chain_schedule(graph, "uniform", num_layers=2),
             "block (half)": lambda: chain_schedule(graph, "block", num_layers=max(1, graph.n // 2)),
             "selective": lambda: nemo(graph, "selective"), "full": lambda: nemo(graph, "full")}
    for name in planners:
        if name in fixed:
            try:
                schedule = fixed[name]()
            except ValueError:
                continue  # NeMo's modes need a transformer
            points.append(_measured(name, None, schedule))
    chain = {}  # the chain planners' plans, made once and picked from at each budget
    for budget in budgets:
        for name in planners:
            if name in fixed:
                continue
            try:
                if name == "DTR":
                    run = dynamic_graph(graph, budget)
                    points.append(Point(name, budget, run.predicted_peak_bytes, run.peak_bytes, run.recompute_flops))
                    continue
                schedule = {"MILP": lambda: checkmate(graph, budget, time_limit=time_limit),
                            "LP rounding": lambda: checkmate(graph, budget, time_limit=time_limit, relax=True),
                            "greedy": lambda: fitting(_plans(chain, graph, "greedy"), budget),
                            "one-level optimal": lambda: fitting(_plans(chain, graph, "optimal"), budget)}[name]()
            except (ValueError, TimeoutError):
                continue
            points.append(_measured(name, budget, schedule))
    return points


def _plans(made: dict, graph: Graph, strategy: str) -> list:
    """The chain planner's plans on ``graph``, made at its first budget and kept in ``made``."""
    if strategy not in made:
        made[strategy] = chain_plans(graph, strategy)
    return made[strategy]


def _measured(name: str, budget: int | None, schedule) -> Point:
    result = execute(schedule)
    return Point(name, budget, schedule.predicted_peak_bytes, result.peak_bytes, result.recompute_flops,
                 schedule.status, schedule.gap, schedule.solve_seconds)
