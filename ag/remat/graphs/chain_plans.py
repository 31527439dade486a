"""The chain planners of ``chains.plans`` on a captured graph, taken as a chain of its nodes in
forward order: each plan is a ``from_keep`` schedule, priced by the graph's memory model."""
from __future__ import annotations

import copy

import numpy as np

from ..chains.cost import ChainProfile
from ..chains.plans import plan
from .graph import Graph
from .keep import from_keep
from .schedule import Schedule, cheapest_within


def chain_schedule(graph: Graph, strategy: str, *, num_layers: int | None = None,
                   budget_bytes: int | None = None) -> Schedule:
    """``plans.plan``'s strategies on the graph's nodes in forward order, as one chain.

    ``greedy`` and ``optimal`` plan in ``predict``'s chain model, whose bytes differ from the
    graph's: they are tried at a range of chain budgets (``chain_plans``), and the plan that
    recomputes least while its graph prediction fits ``budget_bytes`` is returned.
    """
    if strategy in ("greedy", "optimal"):
        if budget_bytes is None:
            raise ValueError(f"chain_schedule: strategy {strategy!r} needs budget_bytes=")
        return fitting(chain_plans(graph, strategy), budget_bytes)
    kept = plan(graph.n, strategy, num_layers=num_layers)
    return from_keep(graph, kept, strategy if num_layers is None else f"{strategy} ({num_layers})")


def chain_plans(graph: Graph, strategy: str) -> list[Schedule]:
    """``greedy`` or ``optimal`` planned at 40 chain budgets, from the largest node to three
    times the sum of the nodes, as schedules on the graph: what ``chain_schedule`` picks from.
    A sweep over graph budgets plans them once (``fitting`` picks each budget's)."""
    if strategy not in ("greedy", "optimal"):
        raise ValueError(f"chain_plans: strategy must be 'greedy' or 'optimal', got {strategy!r}")
    sizes = [max(1, node.size) for node in graph.nodes]
    chain = ChainProfile(tuple(sizes), tuple(max(1, node.flops) for node in graph.nodes))
    tried = []
    for chain_budget in np.unique(np.geomspace(max(sizes), 3 * sum(sizes), 40).astype(np.int64)):
        try:
            tried.append(from_keep(graph, plan(graph.n, strategy, chain=chain, budget_bytes=int(chain_budget)), strategy))
        except ValueError:
            continue  # nothing fits this chain budget
    return tried


def fitting(plans: list[Schedule], budget_bytes: int) -> Schedule:
    """A copy of the plan among ``plans`` that recomputes least while its graph prediction fits
    ``budget_bytes``, with that budget on it."""
    best = cheapest_within(plans, budget_bytes)
    if best is None:
        strategy = plans[0].planner if plans else "chain"
        raise ValueError(f"chain_schedule: no {strategy} plan fits {budget_bytes:,} bytes on this graph")
    best = copy.copy(best)
    best.budget_bytes = budget_bytes
    return best
