"""Exercise 6: the √n plan and the optimal plan under a budget."""
import itertools

import numpy as np
import pytest

from ag import remat


@pytest.mark.points(3)
def test_sqrt_keeps_every_floor_sqrt_n_th_output(student):
    student(6)
    assert remat.plan(64, "sqrt") == [7, 15, 23, 31, 39, 47, 55]
    assert remat.plan(10, "sqrt") == [2, 5, 8]
    assert remat.plan(3, "sqrt") == [0, 1]


def brute_force(profile, budget):
    best = None
    for r in range(profile.n + 1):
        for kept in itertools.combinations(range(profile.n), r):
            cost = remat.predict(profile, kept)
            if cost.peak_bytes <= budget and (best is None or cost.recompute_flops < best):
                best = cost.recompute_flops
    return best


@pytest.mark.points(4)
def test_optimal_recomputes_as_little_as_brute_force(student):
    student(6)
    rng = np.random.default_rng(0)
    profile = remat.ChainProfile(tuple(int(x) for x in rng.integers(1, 9, 8)),
                                 tuple(int(x) for x in rng.integers(1, 9, 8)))
    full = remat.predict(profile, range(8)).peak_bytes
    for budget in np.linspace(full * 0.6, full, 5).astype(int):
        best = brute_force(profile, budget)
        if best is None:
            continue
        kept = remat.plan(8, "optimal", chain=profile, budget_bytes=int(budget))
        assert remat.predict(profile, kept).recompute_flops == best


@pytest.mark.points(3)
def test_the_optimal_plan_fits_its_budget(student):
    student(6)
    profile = remat.as_profile([4, 1, 1, 4, 1, 1, 4, 1, 2, 2])
    for budget in (13, 16, 20):
        kept = remat.plan(10, "optimal", chain=profile, budget_bytes=budget)
        assert remat.predict(profile, kept).peak_bytes <= budget
