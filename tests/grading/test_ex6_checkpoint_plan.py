"""Exercise 6: the √n plan and the optimal plan under a budget."""
import functools
import itertools

import numpy as np
import pytest

from ag import remat
from ag.course import probe
from ag.course.checks import code, expect_equal, expect_true


@probe
def sqrt_plans(ex, sizes):
    """Runs in the worker: the student's sqrt plan for chains of these lengths."""
    return [ex.plan(n, "sqrt") for n in sizes]


@probe
def optimal_plans(ex, sizes, costs, budgets):
    """Runs in the worker: the student's optimal plan at each budget (None where it finds none)."""
    from ag import remat
    profile = remat.ChainProfile(tuple(sizes), tuple(costs))
    plans = []
    for budget in budgets:
        try:
            plans.append(list(ex.plan(len(sizes), "optimal", chain=profile, budget_bytes=budget)))
        except ValueError:
            plans.append(None)
    return plans


@functools.lru_cache(maxsize=None)
def brute_force(profile, budget):
    """The fewest recomputed FLOPs of any plan whose predicted peak fits ``budget`` (None: no plan),
    searched once per judge."""
    return min((flops for peak, flops in every_plan(profile) if peak <= budget), default=None)


@functools.lru_cache(maxsize=4)
def every_plan(profile):
    """(predicted peak, recomputed FLOPs) of each of the chain's 2^n plans, priced once for every budget."""
    costs = [remat.predict(profile, kept) for r in range(profile.n + 1)
             for kept in itertools.combinations(range(profile.n), r)]
    return [(cost.peak_bytes, cost.recompute_flops) for cost in costs]


def long_chain():
    """40 layers of random sizes and costs: 2^40 plans, beyond any search of them within the timeout,
    while the dynamic program takes a fraction of a second."""
    rng = np.random.default_rng(40)
    return remat.ChainProfile(tuple(int(x) for x in rng.integers(1, 9, 40)),
                              tuple(int(x) for x in rng.integers(1, 9, 40)))


LONG_BUDGETS = (51, 76, 102, 136)
LONG_OPTIMUM = (81, 52, 30, 12)  # the fewest recomputed FLOPs at each budget (ag's dynamic program, checked
#                                  in tests/test_course.py)


def expect_long_chain_plans(worker, check_flops: bool):
    """The optimal plans of the 40-layer chain fit their budgets and, if ``check_flops``, recompute the optimum."""
    profile = long_chain()
    plans = worker(optimal_plans, list(profile.sizes), list(profile.costs), list(LONG_BUDGETS))
    expect_true(isinstance(plans, list) and len(plans) == len(LONG_BUDGETS),
                f"**plans of the 40-layer chain**: expected {len(LONG_BUDGETS)} plans, got {code(repr(plans))}")
    for budget, plan, best in zip(LONG_BUDGETS, plans, LONG_OPTIMUM):
        expect_true(valid_plan(plan, 40), f"**plan of 40 layers at budget {budget}**: expected a sorted list of "
                                          f"kept outputs in 0..39, got {code(repr(plan))}")
        cost = remat.predict(profile, plan)
        expect_true(cost.peak_bytes <= budget, f"**plan {plan} of 40 layers at budget {budget}**: its predicted "
                                               f"peak is {cost.peak_bytes}")
        if check_flops:
            expect_equal(cost.recompute_flops, best, what=f"recomputed FLOPs of the optimal 40-layer plan at "
                                                          f"budget {budget}")


def valid_plan(plan, n):
    return isinstance(plan, list) and all(type(k) is int and 0 <= k < n for k in plan) and plan == sorted(set(plan))


@pytest.mark.points(3)
def test_sqrt_keeps_every_floor_sqrt_n_th_output(worker):
    expect_equal(worker(sqrt_plans, [64, 10, 3]), [[7, 15, 23, 31, 39, 47, 55], [2, 5, 8], [0, 1]],
                 what="the sqrt plans for 64, 10 and 3 layers")


@pytest.mark.points(4)
def test_optimal_recomputes_as_little_as_brute_force_and_scales_past_it(worker):
    rng = np.random.default_rng(0)
    profile = remat.ChainProfile(tuple(int(x) for x in rng.integers(1, 9, 8)),
                                 tuple(int(x) for x in rng.integers(1, 9, 8)))
    full = remat.predict(profile, range(8)).peak_bytes
    budgets = [int(b) for b in np.linspace(full * 0.6, full, 5)]
    plans = worker(optimal_plans, list(profile.sizes), list(profile.costs), budgets)
    expect_equal(len(plans), len(budgets), what="the number of plans, one for each budget")
    for budget, plan in zip(budgets, plans):
        best = brute_force(profile, budget)
        if best is None:
            continue
        expect_true(valid_plan(plan, 8), f"**plan at budget {budget}**: expected a sorted list of kept outputs "
                                         f"in 0..7, got {code(repr(plan))}")
        expect_equal(remat.predict(profile, plan).recompute_flops, best,
                     what=f"recomputed FLOPs of the optimal plan at budget {budget} (brute force's)")
    expect_long_chain_plans(worker, check_flops=True)


@pytest.mark.points(3)
def test_the_optimal_plan_fits_its_budget_on_short_and_long_chains(worker):
    profile = remat.as_profile([4, 1, 1, 4, 1, 1, 4, 1, 2, 2])
    budgets = [13, 16, 20]
    plans = worker(optimal_plans, list(profile.sizes), list(profile.costs), budgets)
    expect_equal(len(plans), len(budgets), what="the number of plans, one for each budget")
    for budget, plan in zip(budgets, plans):
        expect_true(valid_plan(plan, 10), f"**plan at budget {budget}**: expected a sorted list of kept "
                                          f"outputs in 0..9, got {code(repr(plan))}")
        peak = remat.predict(profile, plan).peak_bytes
        expect_true(peak <= budget, f"**plan {plan} at budget {budget}**: its predicted peak is {peak}")
    expect_long_chain_plans(worker, check_flops=False)
