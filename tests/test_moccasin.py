"""Moccasin's interval formulation on CP-SAT beside Checkmate's MILP (issue 52): the same optimum
where the MILP proves one, the intervals that suffice, schedules that execute as predicted, and
time limits kept in wall time."""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

from ag import remat
from ag.remat import examples
from ag.remat.graphs import bounds
from ag.remat.graphs.bounds import carry_bound_bytes, recompute_lower_bound
from ag.remat.graphs.checkmate import NoScheduleFits, dtr_schedule, warm_starts
from ag.remat.graphs.costly import _merged, _replayed, free_depth, keep_costly, keep_then_drop, moved_down
from ag.remat.graphs.keep import complete
from ag.remat.graphs.moccasin import _cp_model, _Program, intervals_that_suffice

if os.environ.get("AG_REQUIRE_SOLVER"):
    import ortools  # noqa: F401  (CI installs the solver extra: nothing here may skip)
    import scipy  # noqa: F401
else:
    pytest.importorskip("ortools", reason="moccasin needs the solver extra (OR-Tools' CP-SAT)")
    pytest.importorskip("scipy", reason="checkmate needs the solver extra (scipy's HiGHS)")

from test_remat_graph import brute_force, plain_grads, random_dag  # noqa: E402


@pytest.fixture(scope="module")
def small():
    """name -> (graph, leaves with grad, the plain-backward grads) for graphs that run in a second."""
    out = {}
    for name, make in (("residual MLP", lambda: examples.residual_mlp(blocks=4)), ("U-Net", examples.unet),
                       ("transformer", lambda: examples.transformer(layers=1, dropout=0.0))):
        fn, inputs = make()
        graph = remat.capture(fn, *inputs)
        out[name] = (graph, fn.parameters, plain_grads(fn, inputs, fn.parameters))
    return out


def budgets(graph, count: int = 5) -> list[int]:
    """``count`` budgets from the lower bound to the no-remat peak."""
    floor = remat.lower_bound_bytes(graph)
    return [int(b) for b in np.linspace(floor, remat.chain_schedule(graph, "keep all").predicted_peak_bytes, count)]


# ---- the same optimum as the MILP ----

@pytest.mark.parametrize("seed", range(2))
def test_with_enough_intervals_moccasin_proves_the_milps_optimum_on_random_dags(seed):
    fn, inputs = random_dag(seed, n_ops=5 + seed % 3)
    graph = remat.capture(fn, *inputs)
    enough = intervals_that_suffice(graph)
    compared = 0
    for budget in budgets(graph)[:-1]:  # the no-remat peak costs nothing: nothing to compare
        try:
            milp = remat.checkmate(graph, budget, time_limit=20)
        except ValueError:
            with pytest.raises(ValueError, match="smallest feasible budget"):
                remat.moccasin(graph, budget, intervals=enough)
            continue
        found = remat.moccasin(graph, budget, intervals=enough, time_limit=20)
        assert milp.status == "optimal" and found.status == "optimal" and found.gap == 0
        assert found.recompute_flops == milp.recompute_flops, (seed, budget)
        assert found.predicted_peak_bytes <= budget
        compared += 1
    assert compared >= 3


def test_every_heuristic_schedule_is_an_assignment_of_the_interval_variables_at_its_own_cost(small):
    """The other direction of "the same optimum": any schedule of the memory model is a solution
    of Moccasin's constraints (with enough intervals), CP-SAT checking every constraint."""
    cp_model = _cp_model()
    for graph, _, _ in small.values():
        budget = budgets(graph)[2]
        for schedule in warm_starts(graph, budget)[:2]:
            computations = int(schedule.R.sum(axis=0).max())  # the intervals that hold this schedule
            program = _Program(graph, budget, computations, cp_model, float("inf"))
            for var, value in program._assignment(schedule).items():
                program.model.add(var == value)
            solver = cp_model.CpSolver()
            assert solver.solve(program.model) == cp_model.OPTIMAL, schedule
            assert solver.objective_value == schedule.recompute_flops


def no_keep_costly(*args):
    raise ValueError("this test's warm starts leave keep_costly out")


def test_a_node_computed_three_times_makes_two_intervals_strictly_worse_than_three(small, monkeypatch):
    """On the residual MLP halfway up, the optimum recomputes relu and add outputs (free) twice
    each; with two intervals a node is recomputed once at most, and a matmul must be redone
    (keep_costly, which finds the optimum as a warm start, is left out)."""
    graph = small["residual MLP"][0]
    budget = budgets(graph)[2]
    monkeypatch.setattr(sys.modules["ag.remat.graphs.checkmate"], "keep_costly", no_keep_costly)
    two, three = (remat.moccasin(graph, budget, intervals=c, time_limit=30) for c in (2, 3))
    assert two.proved_within_intervals and two.status == "feasible" and two.recompute_flops > 0
    assert three.status == "optimal" and three.recompute_flops == 0  # 0: no schedule does better
    assert (three.R.sum(axis=0) == 3).any()


def test_one_interval_means_no_recomputation(small):
    graph = small["U-Net"][0]
    loose, tight = budgets(graph)[-1], budgets(graph)[1]
    found = remat.moccasin(graph, loose, intervals=1)
    assert found.status == "optimal" and found.recompute_flops == 0 and found.R.sum() == graph.n
    stuck = remat.moccasin(graph, tight, intervals=1)  # CP-SAT proves nothing fits once: a warm start answers
    assert stuck.found_by.startswith("warm start") and not stuck.proved_within_intervals
    assert stuck.predicted_peak_bytes <= tight and stuck.recompute_flops > 0


def test_a_budget_that_no_c_interval_schedule_fits_says_so_and_names_the_intervals_that_suffice(small):
    graph = small["transformer"][0]
    budget = remat.lower_bound_bytes(graph)
    assert not warm_starts(graph, budget)  # no heuristic reaches the lower bound here
    with pytest.raises(NoScheduleFits, match=f"no schedule computing each node at most 1 time.*raise intervals "
                                             f"\\({intervals_that_suffice(graph)} hold every schedule\\)") as proof:
        remat.moccasin(graph, budget, intervals=1)
    assert proof.value.intervals == 1  # a proof among 1-interval schedules only, not among all


def test_intervals_that_suffice_is_the_most_stages_that_may_compute_a_node(small):
    graph = small["residual MLP"][0]
    assert intervals_that_suffice(graph) == graph.stages - 1  # node 0 is read by the last backward step


# ---- the covering bound: a lower bound on recompute for every schedule ----

def test_the_covering_bound_is_never_above_the_brute_force_optimum_and_often_above_zero():
    above_zero = 0
    for seed in range(4):
        fn, inputs = random_dag(seed, n_ops=5)
        graph = remat.capture(fn, *inputs)
        for budget in budgets(graph, 5)[:-1]:
            best = brute_force(graph, budget)
            bound = recompute_lower_bound(graph, budget)
            if best is not None:
                assert bound <= best * (1 + 1e-9), (seed, budget, bound, best)
                above_zero += bound > 0
    assert above_zero >= 3  # a bound of 0 everywhere would pass the line above and say nothing


def test_the_covering_bound_counts_a_remake_in_each_window_and_so_reaches_the_brute_force_optimum():
    """At these tightest budgets a value is remade between several pairs of instants: counted
    once (x_v alone) the bound is a third to a quarter of the optimum."""
    for seed in (1, 3, 5):
        fn, inputs = random_dag(seed, n_ops=6)
        graph = remat.capture(fn, *inputs)
        budget = budgets(graph)[0]
        assert recompute_lower_bound(graph, budget) == pytest.approx(brute_force(graph, budget)), seed


def test_counting_remakes_window_by_window_bounds_a_residual_mlp_at_its_lower_bound_above_counting_them_once():
    """At the lower bound nothing but r1 fits at block 1's relu step and nothing but h0 at its
    matmul step: the first matmul, under h0 and r0, is remade twice after them, which x_v
    (remade at all) counts once."""
    fn, inputs = examples.residual_mlp(blocks=8, batch=64, width=64)
    graph = remat.capture(fn, *inputs)
    budget = budgets(graph)[0]
    once, windowed = recompute_lower_bound(graph, budget, windows=0), recompute_lower_bound(graph, budget)
    assert 0 < once < windowed <= keep_costly(graph, budget).recompute_flops


def test_windows_between_the_instants_with_least_room_bound_a_transformer_above_the_last_instants(monkeypatch):
    """On 2 layers at the second budget, what backward's matmul steps (their grads and transient
    bytes the largest) cannot hold must be remade between them; the last instants that overflow
    all lie in the first layer's backward and see less of that."""
    fn, inputs = examples.transformer(layers=2, s=64, h=32)
    graph = remat.capture(fn, *inputs)
    budget = budgets(graph)[1]
    least_room = recompute_lower_bound(graph, budget)
    monkeypatch.setattr(bounds, "_least_room", lambda instants, count: instants[-count:])
    last = recompute_lower_bound(graph, budget)
    assert last < least_room <= keep_costly(graph, budget).recompute_flops


def test_at_the_u_nets_middle_budget_the_covering_bound_is_the_optimum(small, monkeypatch):
    """CP-SAT proves the 2-interval optimum without the bound; a valid bound equal to it is the
    optimum over every schedule."""
    graph = small["U-Net"][0]
    budget = budgets(graph)[2]
    monkeypatch.setattr(sys.modules["ag.remat.graphs.moccasin"], "recompute_lower_bound", lambda *args: 0.0)
    two = remat.moccasin(graph, budget, intervals=2, time_limit=30)
    monkeypatch.undo()
    assert two.proved_within_intervals and two.recompute_flops > 0
    assert recompute_lower_bound(graph, budget) == pytest.approx(two.recompute_flops, rel=1e-6)


def test_with_too_few_intervals_moccasin_still_reports_a_bound_for_every_schedule(small):
    graph = small["transformer"][0]
    budget = budgets(graph)[2]
    assert intervals_that_suffice(graph) > 2
    found = remat.moccasin(graph, budget, intervals=2, time_limit=20)
    assert found.recompute_flops > 0 and not found.proved_within_intervals or found.status == "optimal"
    assert 0 < found.lower_bound <= recompute_lower_bound(graph, budget) * (1 + 1e-9) and found.gap < 1


@pytest.mark.parametrize("solver", ["moccasin", "checkmate"])
def test_a_warm_start_that_meets_the_bound_is_proved_optimal_without_a_search(big, solver, monkeypatch):
    graph, _ = big
    loose = budgets(graph)[-1]  # the no-remat peak: "none" fits and costs nothing

    def no_search(*args):
        raise AssertionError("the solver built its program")
    monkeypatch.setattr(sys.modules[f"ag.remat.graphs.{solver}"], "_Program", no_search)
    found = getattr(remat, solver)(graph, loose, time_limit=30)
    assert found.status == "optimal" and found.gap == 0 and found.recompute_flops == 0


# ---- schedules that run ----

def assert_runs_as_predicted(found, leaves, expected) -> None:
    """``execute`` peaks within 5% of the prediction, recomputes what it said, and the grads are bit-identical."""
    for t in leaves:
        t.grad = None
    result = remat.execute(found)
    assert abs(result.peak_bytes - found.predicted_peak_bytes) <= 0.05 * found.predicted_peak_bytes
    assert result.recompute_flops == found.recompute_flops
    assert all(np.array_equal(t.grad, g) for t, g in zip(leaves, expected))


@pytest.mark.parametrize("name", ["residual MLP", "U-Net", "transformer"])
def test_execute_of_a_moccasin_schedule_peaks_within_5_percent_and_its_gradients_are_bit_identical(small, name):
    graph, leaves, expected = small[name]
    found = remat.moccasin(graph, budgets(graph)[1], time_limit=5)
    assert found.recompute_flops > 0
    assert_runs_as_predicted(found, leaves, expected)


@pytest.mark.parametrize("name", ["residual MLP", "U-Net"])
def test_execute_of_keep_costly_peaks_within_5_percent_and_its_gradients_are_bit_identical(small, name):
    graph, leaves, expected = small[name]
    found = keep_costly(graph, budgets(graph)[1])
    assert found.predicted_peak_bytes <= budgets(graph)[1] and len(found.recomputed()) > 0
    assert_runs_as_predicted(found, leaves, expected)


def test_keep_costly_keeps_every_op_that_costs_flops_and_remakes_free_ops_below_the_no_remat_peak(small):
    graph = small["residual MLP"][0]
    budget = budgets(graph)[2]
    found = keep_costly(graph, budget)
    assert found.recompute_flops == 0 and found.predicted_peak_bytes <= budget
    assert found.predicted_peak_bytes < remat.chain_schedule(graph, "keep all").predicted_peak_bytes
    assert found.recomputed() and all(graph.nodes[v].flops == 0 for v in found.recomputed())


def test_keep_costly_drops_the_costly_values_a_tighter_budget_needs_and_fits_it(small):
    graph = small["U-Net"][0]
    costs = []
    for budget in budgets(graph)[1:]:
        found = keep_costly(graph, budget)
        assert found.predicted_peak_bytes <= budget
        assert any(graph.nodes[v].flops > 0 for v in found.recomputed()) == (found.recompute_flops > 0)
        costs.append(found.recompute_flops)
    assert costs[0] > 0 and costs[-1] == 0


def test_keep_then_drop_frees_a_value_after_its_last_use_in_the_peak_stage_and_keeps_it_again_later(small):
    """The MLP at budget 1: every kept value is in use at the peak stage, so it drops one there
    only until its next use, which pays less than dropping the same values for good."""
    graph = small["residual MLP"][0]
    budget, n = budgets(graph)[1], graph.n
    found = keep_then_drop(graph, budget, swap=False)  # the swap (its own test) settles this stage too
    between = [v for v in moved_down(graph) if any(
        (found.S[t, v] or found.R[t, v]) and not found.S[t + 1, v] and found.S[t + 1:, v].any()
        for t in range(n, graph.stages - 1))]
    assert found.predicted_peak_bytes <= budget and between
    for_good = np.zeros_like(found.S)
    for v in moved_down(graph):
        for_good[v + 1:, v] = v not in between
    assert complete(graph, for_good, "for good").recompute_flops > found.recompute_flops


def test_at_the_tightest_budget_keep_costly_keeps_residual_adds_and_pays_less_than_dtr_and_costly_ops_alone():
    """A 26-node residual MLP at its lower bound: remaking each add from the input chains through
    dropped matmuls; checkpoints every sqrt(D) adds pay less than DTR and than keeping none."""
    fn, inputs = examples.residual_mlp(blocks=8, batch=64, width=64)
    graph = remat.capture(fn, *inputs)
    budget, depth = budgets(graph)[0], free_depth(graph)
    found = keep_costly(graph, budget)
    assert found.predicted_peak_bytes <= budget
    assert any(found.S[graph.n, v] and depth[v] > 1 for v in range(graph.n))  # an add kept into backward
    costly_only, dtr = keep_then_drop(graph, budget), dtr_schedule(graph, budget)
    assert costly_only.predicted_peak_bytes <= budget and dtr.predicted_peak_bytes <= budget
    assert found.recompute_flops < min(costly_only.recompute_flops, dtr.recompute_flops)


def test_keep_costly_keeps_a_matmuls_relu_in_its_place_as_backward_reads_the_relu_not_the_matmul(small):
    graph = small["residual MLP"][0]
    read = set().union(*(step.reads for step in graph.steps))
    matmuls = [v for v, node in enumerate(graph.nodes) if node.op == "matmul"]
    assert matmuls and not read & set(matmuls)
    relus = [graph.users[v][0] for v in matmuls]
    assert all(graph.nodes[r].op == "relu" and r in read for r in relus)
    assert sorted(moved_down(graph)) == sorted(relus)


def test_a_value_above_a_residual_mlps_lower_bound_one_add_kept_for_the_relus_below_it_pays_less_than_sqrt_checkpoints():
    """Backward reads every relu, and a value above the lower bound there is one slot short of them
    all (at the bound itself, early backward stages also hold every node's Tensor and closure):
    keeping the first add that two kept relus remake, in their place, frees that slot for one
    late remake of each; it pays less than every checkpoint spacing Chen's rule tries."""
    fn, inputs = examples.residual_mlp(blocks=8, batch=64, width=64)
    graph = remat.capture(fn, *inputs)
    budget = budgets(graph)[0] + graph.nodes[0].size
    merged = keep_then_drop(graph, budget, merge=True)
    first_add = next(v for v, node in enumerate(graph.nodes) if node.op == "add" and len(node.deps) == 2)
    assert merged.predicted_peak_bytes <= budget and merged.S[graph.n, first_add]
    s = round(max(free_depth(graph)) ** 0.5)
    for every in (s, s // 2, 2 * s, 0):
        spaced = keep_then_drop(graph, budget, every=every)
        assert spaced.predicted_peak_bytes <= budget and merged.recompute_flops < spaced.recompute_flops
    assert keep_costly(graph, budget).recompute_flops == merged.recompute_flops


def test_at_a_residual_mlps_lower_bound_keeping_the_top_add_in_place_of_its_relu_reaches_the_proved_optimum():
    """The top block's matmul step holds a few bytes more than the others: one slot short again.
    Keeping the add that step reads, in place of the relu it was remade from, costs one late
    remake of that relu; the covering bound proves nothing pays less."""
    fn, inputs = examples.residual_mlp(blocks=5, batch=64, width=64)
    graph = remat.capture(fn, *inputs)
    budget = budgets(graph)[0]
    found = keep_costly(graph, budget)
    top_matmul = max(v for v, node in enumerate(graph.nodes) if node.op == "matmul")
    add = graph.nodes[top_matmul].deps[0]
    relu = graph.nodes[add].deps[1]
    step = graph.n + next(j for j, step in enumerate(graph.steps) if step.node == top_matmul)
    assert found.predicted_peak_bytes <= budget and found.S[step, add] and not found.R[graph.n:, add].any()
    assert found.R[graph.n:, relu].sum() == 1  # made again once, late
    assert found.recompute_flops == pytest.approx(recompute_lower_bound(graph, budget), rel=1e-9)


def test_at_a_residual_mlps_lower_bound_an_add_kept_for_a_segment_of_relus_replayed_once_pays_less_than_the_merge_alone():
    """At the lower bound, early backward also holds every node's Tensor and closure: with the first
    add merged, the peak is still several values over. Keeping a later add in place of relus below
    it worth that overflow, out until backward first reads one, then replayed once and kept until
    read, pays less than the drops that fit the merge alone, and than Chen's spacings."""
    fn, inputs = examples.residual_mlp(blocks=16, batch=64, width=64)
    graph = remat.capture(fn, *inputs)
    budget = budgets(graph)[0]
    wanted = np.zeros((graph.stages, graph.n), dtype=bool)
    for v in moved_down(graph):
        wanted[v + 1:, v] = True
    merged = _merged(graph, wanted)
    overflow = complete(graph, merged, "merged").predicted_peak_bytes - budget
    replayed = _replayed(graph, merged, overflow)
    (c,) = [v for v in range(graph.n) if replayed[v + 1:, v].any() and not merged[v + 1:, v].any()]
    out = [v for v in range(graph.n) if merged[v + 1, v] and not replayed[v + 1, v]]
    assert graph.nodes[c].op == "add" and all(graph.nodes[v].op == "relu" and v < c for v in out)
    assert sum(graph.nodes[v].size for v in out) - graph.nodes[c].size >= overflow > 0
    replay = min(np.flatnonzero(replayed[graph.n:, v])[0] for v in out) + graph.n
    assert all(not replayed[v + 1:replay, v].any() and replayed[replay, v] for v in out)  # out, then back once
    once = keep_then_drop(graph, budget, merge=True)
    found = keep_then_drop(graph, budget, merge=True, replay=True)
    assert once.predicted_peak_bytes <= budget and found.predicted_peak_bytes <= budget
    s = round(max(free_depth(graph)) ** 0.5)
    spaced = [keep_then_drop(graph, budget, every=every) for every in (s, s // 2, 2 * s, 0)]
    assert found.recompute_flops < min(f.recompute_flops for f in [once, *spaced] if f.predicted_peak_bytes <= budget)
    assert keep_costly(graph, budget).recompute_flops <= found.recompute_flops


def test_with_two_intervals_keep_costly_gives_moccasin_an_optimum_its_intervals_cannot_hold(small):
    """The MLP's optimum halfway up remakes free ops more than twice: CP-SAT's 2-interval model
    cannot state it, the warm start can, and the covering bound (0) proves it."""
    graph = small["residual MLP"][0]
    found = remat.moccasin(graph, budgets(graph)[2], intervals=2, time_limit=30)
    assert found.status == "optimal" and found.recompute_flops == 0 and found.found_by == "warm start (keep costly)"
    assert found.R.sum(axis=0).max() > 2


def test_dtr_replayed_without_computing_is_a_schedule_that_fits_where_dtr_did(small):
    graph = small["U-Net"][0]
    budget = budgets(graph)[2]
    schedule = dtr_schedule(graph, budget)
    assert schedule.recompute_flops > 0 and schedule.predicted_peak_bytes <= budget
    assert schedule.recompute_flops == remat.dynamic(graph, budget).recompute_flops


# ---- wall time and warm starts ----

@pytest.fixture(scope="module")
def big():
    fn, inputs = examples.transformer(layers=4)
    graph = remat.capture(fn, *inputs)
    return graph, budgets(graph)[1]


SLACK = 1.5  # seconds past the limit: a deadline check's granularity, a killed HiGHS child, a busy machine


def solved_within(solver: str, graph, budget: int, limit: float):
    """``solver``'s answer, once it came within ``limit`` + SLACK, fits ``budget`` and has a gap."""
    start = time.perf_counter()
    found = getattr(remat, solver)(graph, budget, time_limit=limit)
    seconds = time.perf_counter() - start
    assert seconds <= limit + SLACK, seconds
    assert found.predicted_peak_bytes <= budget and found.status in ("optimal", "feasible")
    assert found.lower_bound is not None and 0 <= found.gap <= 1
    return found


@pytest.mark.parametrize("solver", ["moccasin", "checkmate"])
def test_a_small_time_limit_on_a_big_graph_is_kept_in_wall_time_with_a_warm_start_as_the_answer(big, solver):
    graph, budget = big
    found = solved_within(solver, graph, budget, 3)
    assert found.recompute_flops <= min(s.recompute_flops for s in warm_starts(graph, budget))


@pytest.fixture(scope="module")
def mlp500():
    """A 500-node residual MLP (1,000 stages) at its lower bound: there DTR's warm starts thrash,
    and they, the covering bound and the MILP's build each take seconds, so a 10 s limit must cut them."""
    fn, inputs = examples.residual_mlp(blocks=166, batch=64, width=64)
    with np.errstate(all="ignore"):  # 166 blocks overflow float32; the graph, not the values, is planned
        graph = remat.capture(fn, *inputs)
    return graph, budgets(graph)[0]


@pytest.mark.parametrize("solver", ["moccasin", "checkmate"])
def test_a_500_node_graph_under_a_10_s_limit_returns_within_it_with_a_fitting_schedule_and_a_gap(mlp500, solver):
    graph, budget = mlp500
    found = solved_within(solver, graph, budget, 10)
    assert found.recompute_flops <= dtr_schedule(graph, budget).recompute_flops  # the one heuristic that fits



def test_enough_intervals_for_every_schedule_keep_the_time_limit_while_the_model_is_built(big):
    graph = big[0]  # the 4-layer transformer
    C = intervals_that_suffice(graph)  # 217: CP-SAT's model takes longer to build than the limit
    start = time.perf_counter()
    with pytest.raises((TimeoutError, NoScheduleFits)):
        remat.moccasin(graph, remat.lower_bound_bytes(graph), intervals=C, time_limit=6)
    assert time.perf_counter() - start <= 6 + SLACK


# ---- bad input ----

def test_a_budget_below_the_lower_bound_names_it_and_is_proved_infeasible_for_every_schedule(small):
    graph = small["residual MLP"][0]
    floor = remat.lower_bound_bytes(graph)
    for solver in (remat.moccasin, remat.checkmate):
        with pytest.raises(NoScheduleFits, match=f"smallest feasible budget is at least {floor:,} bytes") as proof:
            solver(graph, floor - 1)
        assert proof.value.intervals is None  # proved for every schedule


def test_the_carry_bound_is_never_above_the_brute_force_smallest_peak_and_sometimes_above_the_lower_bound():
    above = 0
    for seed, n_ops in ((0, 5), (1, 5), (16, 6)):
        fn, inputs = random_dag(seed, n_ops)
        graph = remat.capture(fn, *inputs)
        bound = carry_bound_bytes(graph)
        assert bound >= remat.lower_bound_bytes(graph)
        assert brute_force(graph, bound - 1) is None, (seed, bound)  # no schedule at all fits below it
        if bound > remat.lower_bound_bytes(graph):
            above += 1
            assert brute_force(graph, bound) is not None  # here some schedule reaches it
    assert above >= 1  # equal to the lower bound everywhere, the lines above would test nothing new


def test_a_one_layer_transformer_keeping_nothing_peaks_at_the_carry_bound_above_the_lower_bound():
    """The lower bound is no schedule's peak here; the carry bound is one's: it cannot be lower."""
    fn, inputs = examples.transformer(layers=1)
    graph = remat.capture(fn, *inputs)
    nothing = complete(graph, np.zeros((graph.stages, graph.n), dtype=bool), "keep nothing")
    assert nothing.predicted_peak_bytes == carry_bound_bytes(graph) > remat.lower_bound_bytes(graph)
    for solver in (remat.moccasin, remat.checkmate):
        with pytest.raises(NoScheduleFits, match=f"at least {carry_bound_bytes(graph):,} bytes") as proof:
            solver(graph, remat.lower_bound_bytes(graph), time_limit=10)
        assert proof.value.intervals is None  # proved for every schedule, before any search


@pytest.mark.parametrize("intervals", [0, -2, 1.5, "2"])
def test_intervals_below_one_or_not_an_integer_are_refused(small, intervals):
    with pytest.raises(ValueError, match=f"intervals must be an integer of at least 1.*got {intervals!r}"):
        remat.moccasin(small["residual MLP"][0], 10**9, intervals=intervals)


@pytest.mark.parametrize("limit", [0, -1, "60"])
def test_a_time_limit_that_is_not_positive_is_refused(small, limit):
    with pytest.raises(ValueError, match="time_limit must be a positive number"):
        remat.moccasin(small["residual MLP"][0], 10**9, time_limit=limit)


def test_a_missing_ortools_names_the_solver_extra(small, monkeypatch):
    monkeypatch.setitem(sys.modules, "ortools.sat.python", None)
    with pytest.raises(ImportError, match=r"OR-Tools.*pip install 'ag\[solver\]'"):
        remat.moccasin(small["residual MLP"][0], 10**9)


# ---- the benchmark's rows ----

def test_the_solver_table_counts_a_proof_for_every_schedule_as_solved_and_one_among_c_intervals_not(small):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from remat_solver import _cells, _timed
    graph = small["transformer"][0]
    found, seconds = _timed(remat.moccasin, graph, remat.lower_bound_bytes(graph), intervals=1, time_limit=10)
    assert _cells(found, seconds, 0.0)[1:] == ["none with C=1", "proved", 1.0]
    found, seconds = _timed(remat.checkmate, graph, remat.lower_bound_bytes(graph) - 1, time_limit=10)
    assert _cells(found, seconds, 0.0)[1:] == ["infeasible", "proved", 0.0]
