"""Exercise 7: DTR's eviction rule, e*(t) and h_DTR.

The judge gives the structure of each graph (every node's deps) and the worker captures a step
of exactly that structure, so the judge needs no capture of its own. The public checks compare
with neighbourhoods worked out once (below); e*'s search itself is no public reference, since it is
the exercise: the hidden test searches other graphs with the judge's own."""
import numpy as np
import pytest
from references import dtr_scores

from ag.course import probe
from ag.course.checks import code, expect_close, expect_equal, expect_true


def random_dag(seed, n):
    """The deps of a random step of n nodes: node 0 reads only leaves, node k reads node k - 1
    (so every node reaches the loss) and, half the time, an earlier node too; node n - 1 is the loss."""
    rng = np.random.default_rng(seed)
    deps = [[]]
    for k in range(1, n - 1):
        skip = [int(rng.integers(0, k - 1))] if k >= 2 and rng.random() < 0.5 else []
        deps.append([k - 1, *skip])
    return deps + [[n - 2]]


def step_with(deps):
    """A step whose captured graph has these deps: node 0 is x @ w, a node with one input its tanh,
    one with two inputs their sum, product or matrix product, and the last node the loss Σ."""
    import ag
    rng = np.random.default_rng(0)
    w = ag.Tensor(rng.standard_normal((4, 4)) / 2, requires_grad=True)
    binary = (ag.add, ag.mul, ag.matmul)

    def step(x):
        h = [x @ w]
        for k, d in enumerate(deps[1:-1], start=1):
            h.append(ag.tanh(h[d[0]]) if len(d) == 1 else binary[k % 3](h[d[0]], h[d[1]]))
        return ag.sum(h[-1])
    return step, ag.Tensor(rng.standard_normal((4, 4)))


@probe
def neighbourhoods(ex, deps, queries):
    """Runs in the worker: the student's e*(i), sorted, on a captured step with these deps, for each (i, evicted)."""
    from ag import remat
    graph = remat.capture(*step_with(deps))
    return [sorted(ex.evicted_neighbourhood(graph, i, set(evicted))) for i, evicted in queries]


@probe
def scores(ex, table):
    """Runs in the worker: the student's h_dtr for each (cost, size, staleness)."""
    return np.array([ex.h_dtr(cost, size, staleness) for cost, size, staleness in table], dtype=np.float64)


def random_queries(seed, n):
    """Eight (i, evicted) pairs on a graph of n nodes, each node evicted with a growing probability."""
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(n)), [int(e) for e in np.flatnonzero(rng.random(n) < p)])
            for p in (0.2, 0.4, 0.6, 0.6, 0.8, 0.8, 0.9, 1.0)]


def expect_neighbourhoods(got, wanted, queries, where):
    expect_true(isinstance(got, list) and len(got) == len(queries),
                f"**e\\* on {where}**: expected a list of {len(queries)} neighbourhoods, got {code(repr(got))}")
    for (i, evicted), neighbours, want in zip(queries, got, wanted):
        expect_equal(neighbours, want, what=f"e\\*({i}) on {where}, with {evicted} evicted (sorted)")


# e*(i) of random_queries(100 + seed, 14) on random_dag(seed, 14), worked out by a breadth-first search
NEIGHBOURHOODS = (
    [[], [], [6, 7, 8], [2], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13], [0, 1, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13],
     [0, 3, 4, 5, 12, 13], [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13]],
    [[], [], [0, 1, 4, 5, 9, 10, 11, 12, 13], [10], [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 13], [13],
     [0, 1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13]],
    [[], [], [0, 3, 5, 7, 8, 11, 12, 13], [0, 1, 2, 4, 7, 8, 11], [0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 12],
     [1, 2, 4, 5, 6, 7, 9, 10], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13],
     [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13]],
)


@pytest.mark.points(2)
def test_the_evicted_neighbourhood_on_random_graphs(worker):
    for seed, wanted in enumerate(NEIGHBOURHOODS):
        deps, queries = random_dag(seed, 14), random_queries(100 + seed, 14)
        expect_neighbourhoods(worker(neighbourhoods, deps, queries), wanted, queries,
                              f"the random graph {seed} (deps {code(deps)})")


@pytest.mark.points(1)
def test_h_dtr_is_cost_over_bytes_times_staleness(worker):
    table = [[1, 1, 1], [96, 256, 3], [3000.0, 1024, 4], [7.5, 8, 2], [0.5, 4096, 10], [1e9, 3, 7],
             [12, 1_000_000, 1]]
    expect_close(worker(scores, table), dtr_scores(table), rtol=1e-12,
                 what="h_DTR for (cost, bytes, staleness) = " + ", ".join(str(tuple(row)) for row in table))


@pytest.mark.points(2)
def test_the_search_goes_on_through_evicted_values_and_stops_at_resident_ones(worker):
    deps = [[]] + [[k - 1] for k in range(1, 8)]  # the chain 0 → 1 → … → 7 (the loss)
    evicted = [1, 2, 3, 5, 6]
    queries = [(4, evicted), (0, evicted), (7, evicted)]
    got = worker(neighbourhoods, deps, queries)
    expect_true(isinstance(got, list) and len(got) == 3,
                f"**e\\* on the chain**: expected a list of 3 neighbourhoods, got {code(repr(got))}")
    expect_equal(got[0], [1, 2, 3, 5, 6], what="e\\*(4) on the chain 0 → … → 7 with 1, 2, 3, 5 and 6 evicted "
                                                "(1 is reached through the evicted 3 and 2, 6 through the evicted 5)")
    expect_equal(got[1], [1, 2, 3], what="e\\*(0) on the same chain (5 and 6 lie beyond 4, which is resident)")
    expect_equal(got[2], [5, 6], what="e\\*(7) on the same chain (1, 2 and 3 lie beyond 4, which is resident)")
