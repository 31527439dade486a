"""A hidden test of exercise 7: e*(i) on graphs the public tests do not show, against the judge's
own breadth-first search."""
import pytest
from judge_references import reachable_through_evicted
from test_ex7_dtr_eviction import expect_neighbourhoods, neighbourhoods, random_dag, random_queries

from ag.course.checks import code


@pytest.mark.hidden
@pytest.mark.points(1)
def test_the_evicted_neighbourhood_on_unseen_random_graphs(worker):
    for seed in (7, 8, 9):
        n = 11 + seed
        deps, queries = random_dag(seed, n), random_queries(200 + seed, n)
        wanted = [sorted(reachable_through_evicted(deps, i, evicted)) for i, evicted in queries]
        expect_neighbourhoods(worker(neighbourhoods, deps, queries), wanted, queries,
                              f"the random graph {seed} (deps {code(deps)})")
