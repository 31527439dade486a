"""Rematerialization on any graph: capture, one memory model, execute, Checkmate's MILP, revolve,
DTR, and the fixed plans as schedules (issue 12)."""
from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ag
from ag import memory_model, nn, remat
from ag.remat import examples
from ag.attention import flash_attention
from ag.remat.graphs.costly import keep_costly
from ag.remat.graphs.execute import keep_all
from ag.remat.graphs.model import prune, stage_peak

if os.environ.get("AG_REQUIRE_SOLVER"):
    import scipy  # noqa: F401  (CI installs the solver extra: nothing here may skip)
else:
    pytest.importorskip("scipy", reason="checkmate needs the solver extra (scipy's HiGHS)")


# ---- the test graphs: the lecture's (ag.remat.examples) ----

def residual_mlp(blocks: int = 4):
    fn, inputs = examples.residual_mlp(blocks=blocks)
    return fn, inputs, fn.parameters


def unet():
    fn, inputs = examples.unet()
    return fn, inputs, fn.parameters


def transformer_layer(attention: str = "naive", dtype=np.float32, layers: int = 1):
    """The model and an identical twin (same weights, same dropout masks on its first call)."""
    fn, inputs = examples.transformer(layers=layers, attention=attention, dtype=dtype)
    twin_fn, _ = examples.transformer(layers=layers, attention=attention, dtype=dtype)
    return fn, inputs, fn.parameters, twin_fn, twin_fn.model


def matmul_chain(n: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = ag.Tensor(rng.standard_normal((2048, 64)).astype(np.float32))
    ws = [ag.Tensor((rng.standard_normal((64, 64)) * 0.1).astype(np.float32), requires_grad=True) for _ in range(n)]

    def fn(x):
        h = x
        for w in ws:
            h = h @ w
        return ag.sum(h)
    return fn, (x,), ws


def plain_grads(fn, inputs, leaves):
    """The gradients of an ordinary backward(), as the oracle for every schedule."""
    for t in leaves:
        t.grad = None
    fn(*inputs).backward()
    grads = [t.grad.copy() for t in leaves]
    for t in leaves:
        t.grad = None
    return grads


@pytest.fixture(scope="module")
def graphs():
    """name -> (graph, leaves with grad, the plain-backward grads)."""
    out = {}
    for name, make in (("residual MLP", residual_mlp), ("U-Net", unet)):
        fn, inputs, leaves = make()
        out[name] = (remat.capture(fn, *inputs), leaves, plain_grads(fn, inputs, leaves))
    for name, options in (("transformer (naive)", {}), ("transformer (flash)", {"attention": "flash"}),
                          ("2-layer transformer", {"layers": 2})):
        fn, inputs, leaves, twin_fn, twin = transformer_layer(**options)
        graph = remat.capture(fn, *inputs)
        # the twin has the same weights and draws the same dropout masks on its first call
        twin_leaves = [*twin.parameters(), *inputs]
        out[name] = (graph, leaves, plain_grads(twin_fn, inputs, twin_leaves))
    return out


_solved: dict = {}


def checkmate(graph, budget, **options):
    """remat.checkmate, solved once per graph, budget and options in this module: several tests ask
    HiGHS the same question (the graph is kept with its answer, so its id is never reused)."""
    key = (id(graph), int(budget), tuple(sorted(options.items())))
    if key not in _solved:
        _solved[key] = (graph, remat.checkmate(graph, int(budget), **options))
    return _solved[key][1]


def run(schedule, leaves):
    for t in leaves:
        t.grad = None
    result = remat.execute(schedule)
    grads = [t.grad.copy() for t in leaves]
    return result, grads


def planners(graph):
    """Every fixed planner that applies to this graph."""
    out = [remat.chain_schedule(graph, s) for s in ("keep all", "keep none", "sqrt")]
    out.append(remat.chain_schedule(graph, "uniform", num_layers=2))
    for granularity in ("selective", "full"):
        try:
            out.append(remat.nemo(graph, granularity))
        except ValueError:
            pass
    return out


# ---- capture ----

_TWO_CAPTURES = """
from ag import remat
from ag.remat import examples
def measured(make):
    fn, inputs = make()
    graph = remat.capture(fn, *inputs)
    return remat.lower_bound_bytes(graph), [step.grad_bytes for step in graph.steps]
for make in (lambda: examples.residual_mlp(blocks=2), lambda: examples.transformer(layers=1, s=32)):
    print(measured(make) == measured(make), measured(make)[0])
"""


def test_the_first_capture_in_a_fresh_process_measures_what_later_ones_do():
    """Issue 49: the first capture of a process once gave another lower bound than later ones, so
    one checkmate budget raised or solved depending on which capture it got. Then, in a venv, 1 run
    in 4: a block traced before a measured run and freed during it took 53 B off one node. (An op's
    workspace may still differ by a few hundred bytes of the interpreter's small objects.)"""
    out = subprocess.run([sys.executable, "-c", _TWO_CAPTURES], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0::2] == ["True", "True"], out.stdout
    assert int(lines[1]) > 0


_WITH_A_GC_CALLBACK = """
import gc
from ag import remat
from ag.remat import examples
def hidden():
    fn, inputs = examples.transformer(layers=1, s=32)
    return [node.hidden_bytes for node in remat.capture(fn, *inputs).nodes]
alone = hidden()
gc.callbacks.append(lambda phase, info: None)
print(hidden() == alone, sum(alone))
"""


def test_a_gc_callback_another_library_set_does_not_change_what_capture_measures():
    """CI: after a hypothesis test, lecture 6.4's peaks came out 168 B lower: hypothesis sets a gc
    callback, and the info dict a collection hands it went to the interpreter's free list, served
    untraced to the first op measured. In a fresh process, so that no callback is there before."""
    out = subprocess.run([sys.executable, "-c", _WITH_A_GC_CALLBACK], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    same, total = out.stdout.split()
    assert same == "True" and int(total) > 0, out.stdout


def test_capture_records_every_op_output_with_its_bytes_flops_and_inputs():
    fn, inputs, leaves = residual_mlp(blocks=3)
    with ag.count_ops() as counts:
        fn(*inputs)
    graph = remat.capture(fn, *inputs)
    assert [node.op for node in graph.nodes] == ["matmul", "relu", "add"] * 3 + ["mul", "sum"]
    assert graph.forward_flops == sum(counts.flops.values()) == 3 * 2 * 256 * 128 * 128
    assert [node.bytes for node in graph.nodes[:-1]] == [256 * 128 * 4] * 10
    assert graph.nodes[5].deps == (2, 4)  # h + relu(h @ w): the block's input and its relu
    assert len(graph.steps) == graph.n and graph.steps[0].node == graph.loss
    assert {id(t) for t in graph.leaves} >= {id(w) for w in leaves}


def test_capture_knows_what_each_backward_step_reads():
    fn, inputs, _ = residual_mlp(blocks=1)
    graph = remat.capture(fn, *inputs)
    reads = {graph.nodes[step.node].op: step.reads for step in graph.steps}
    assert reads["relu"] == (1,)      # relu saves its output
    assert reads["add"] == ()         # add reads nothing
    assert reads["mul"] == (2,)       # h * h reads h


def test_capture_marks_views_so_that_keeping_a_view_keeps_its_base(graphs):
    graph = graphs["transformer (naive)"][0]
    views = [node for node in graph.nodes if node.view_of is not None]
    assert views and all(node.bytes == 0 for node in views)
    qkv = next(node for node in graph.nodes if node.op == "linear")
    assert any(graph.storage_of[v.index] == qkv.index for v in views)  # Q, K and V view the QKV output


@pytest.mark.parametrize("name", ["residual MLP", "U-Net", "transformer (naive)", "transformer (flash)",
                                  "2-layer transformer"])
def test_capture_works_on_every_model_and_draws_itself(graphs, name):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    graph = graphs[name][0]
    assert graph.n > 5 and graph.steps and graph.forward_flops > 0
    ax = graph.draw(schedule=remat.chain_schedule(graph, "sqrt"))
    assert len(ax.collections) >= 1 and len(ax.lines) >= graph.n - 1
    plt.close("all")


def test_capture_of_a_step_with_no_grad_is_refused():
    x = ag.Tensor(np.ones((4, 4), np.float32))
    with pytest.raises(remat.CaptureError, match="does not require grad"):
        remat.capture(lambda x: ag.sum(x * x), x)
    with pytest.raises(remat.CaptureError, match="scalar"):
        remat.capture(lambda x: x * ag.Tensor(np.ones((4, 4), np.float32), requires_grad=True), x)


def test_capture_refuses_an_op_that_gave_make_output_no_call():
    def square(a):
        def _backward(out, saved):
            return (2 * saved[a] * out.grad,)
        return ag.make_output(a.value * a.value, "square", (a,), _backward, saves=(a,))
    x = ag.Tensor(np.ones((4, 4)), requires_grad=True)
    with pytest.raises(remat.CaptureError, match=r"op square gave make_output no call=\(fn, \*args\)"):
        remat.capture(lambda x: ag.sum(square(x)), x)


def test_each_ops_op_run_event_carries_a_call_that_makes_the_same_value_again():
    from ag import hooks
    rng = np.random.default_rng(0)
    x = ag.Tensor(rng.standard_normal((2, 3, 4)), requires_grad=True)
    w = ag.Tensor(rng.standard_normal((4, 5)), requires_grad=True)
    b = ag.Tensor(rng.standard_normal(5), requires_grad=True)
    runs = []
    with hooks.subscribed("op run", lambda output, call: runs.append((output, call))):
        ops = [x + 2, 3 - x, x * x, x / 2, x ** 3, -x, ag.exp(x), ag.log(x * x + 1), ag.sqrt(x * x), ag.relu(x),
               ag.tanh(x), ag.sigmoid(x), ag.gelu(x), ag.sum(x, axis=1), ag.mean(x, (0, 2), keepdims=True),
               ag.max(x, -1), ag.logsumexp(x, 1), ag.softmax(x), ag.log_softmax(x, 0), x @ w,
               ag.linear(x, w), ag.linear(x, w, b), x.reshape(6, 4), x.T, x[1, ::2], ag.concat([x, x], 1),
               ag.where(x.value > 0, x, 0.5), ag.layer_norm(x, b[:4], b[1:]), ag.dropout(x, 0.5, rng),
               ag.scaled_masked_softmax(x, 0.5, causal=True), flash_attention(x, x, x, causal=True)]
    assert {out.op for out, _ in runs} >= {out.op for out in ops} and len({out.op for out in ops}) == 30
    for out, (fn, *args) in runs:
        again = fn(*args)
        np.testing.assert_array_equal(again.value, out.value, err_msg=f"{out.op}'s call made another value")


# ---- one memory model ----

@pytest.mark.parametrize("name", ["residual MLP", "U-Net", "transformer (naive)", "transformer (flash)",
                                  "2-layer transformer"])
def test_prediction_is_within_5_percent_of_the_measured_peak_for_every_planner(graphs, name):
    graph, leaves, _ = graphs[name]
    schedules = planners(graph)
    middle = (remat.lower_bound_bytes(graph) + schedules[0].predicted_peak_bytes) // 2
    schedules.append(checkmate(graph, middle, time_limit=10))
    try:  # the 2-layer transformer's LP: 10 to 14 s on an idle 2-vCPU machine, past 40 s on a loaded one
        schedules.append(checkmate(graph, middle, relax=True, time_limit=120))
    except ValueError:
        pass  # LP rounding may find nothing within the budget; the MILP above did
    for schedule in schedules:
        result, _ = run(schedule, leaves)
        error = abs(result.peak_bytes - schedule.predicted_peak_bytes) / schedule.predicted_peak_bytes
        assert error <= 0.05, (schedule, result.peak_bytes)
        assert result.recompute_flops == schedule.recompute_flops, schedule


@pytest.mark.parametrize("name", ["residual MLP", "U-Net", "transformer (naive)", "transformer (flash)",
                                  "2-layer transformer"])
def test_dtr_predicts_its_own_peak_within_5_percent(graphs, name):
    graph, leaves, _ = graphs[name]
    none = remat.chain_schedule(graph, "keep all").predicted_peak_bytes
    for heuristic in remat.HEURISTICS:
        for t in leaves:
            t.grad = None
        result = remat.dynamic(graph, int(0.75 * none), heuristic=heuristic)
        assert abs(result.peak_bytes - result.predicted_peak_bytes) <= 0.05 * result.predicted_peak_bytes


# ---- bit-identical gradients ----

@pytest.mark.parametrize("name", ["residual MLP", "U-Net", "transformer (naive)", "transformer (flash)",
                                  "2-layer transformer"])
def test_gradients_are_bit_identical_to_plain_backward_under_every_schedule_and_dtr(graphs, name):
    graph, leaves, expected = graphs[name]
    schedules = planners(graph)
    middle = (remat.lower_bound_bytes(graph) + schedules[0].predicted_peak_bytes) // 2
    schedules.append(checkmate(graph, middle, time_limit=10))  # the same solve as the prediction test's
    for schedule in schedules:
        _, grads = run(schedule, leaves)
        assert all(np.array_equal(a, b) for a, b in zip(grads, expected)), schedule
    for heuristic in ("dtr", "dtr_eq"):
        for t in leaves:
            t.grad = None
        result = remat.dynamic(graph, int(0.7 * schedules[0].predicted_peak_bytes), heuristic=heuristic)
        assert result.evictions > 0
        assert all(np.array_equal(t.grad, b) for t, b in zip(leaves, expected)), heuristic


def test_dynamic_captures_a_function_itself():
    fn, inputs, leaves = residual_mlp(blocks=2)
    expected = plain_grads(fn, inputs, leaves)
    result = remat.dynamic(fn, *inputs, budget_bytes=10**9)
    assert result.evictions == 0 and result.recompute_flops == 0
    assert all(np.array_equal(t.grad, b) for t, b in zip(leaves, expected))


def test_dtr_recomputes_more_as_its_budget_shrinks(graphs):
    graph, leaves, _ = graphs["residual MLP"]
    none = remat.chain_schedule(graph, "keep all").predicted_peak_bytes
    flops = [remat.dynamic(graph, int(f * none)).recompute_flops for f in (1.0, 0.8, 0.6)]
    assert flops[0] == 0 and flops[0] <= flops[1] <= flops[2] and flops[2] > 0



def test_dtr_records_the_schedule_it_ran_which_the_model_prices_and_execute_replays(graphs):
    graph, leaves, expected = graphs["U-Net"]
    none = remat.chain_schedule(graph, "keep all").predicted_peak_bytes
    result = remat.dynamic(graph, int(0.6 * none))
    ran = result.schedule
    assert isinstance(ran, remat.Schedule) and result.recompute_flops > 0
    assert ran.recompute_flops == result.recompute_flops  # the same recomputations, priced by simulate
    assert ran.predicted_peak_bytes <= result.predicted_peak_bytes
    replayed, grads = run(ran, leaves)
    assert replayed.recompute_flops == result.recompute_flops
    assert all(np.array_equal(a, b) for a, b in zip(grads, expected))


def test_one_prediction_class_prices_chain_plans_and_schedules(graphs):
    graph = graphs["residual MLP"][0]
    schedule = remat.chain_schedule(graph, "keep none")
    assert type(schedule.prediction) is remat.Prediction is type(remat.predict([4, 4, 4], []))
    assert schedule.prediction.recompute_layers == len(schedule.recomputed()) > 0  # each segment replayed once


def test_nemo_reads_the_scopes_a_model_names_not_its_function_names():
    w = ag.Tensor(np.random.default_rng(0).standard_normal((8, 8)), requires_grad=True)

    def fn(x):
        h = ag.tanh(x @ w)
        with ag.scopes.scope("transformer layer"):
            with ag.scopes.scope("attention core"):
                core = ag.relu(h @ w)
            out = core * h
        return ag.sum(out)
    graph = remat.capture(fn, ag.Tensor(np.ones((4, 8))))
    assert [node.scope for node in graph.nodes] == [(), (), ("transformer layer#0", "attention core#0"),
                                                    ("transformer layer#0", "attention core#0"),
                                                    ("transformer layer#0",), ()]
    selective = remat.nemo(graph, "selective")
    assert selective.recomputed() == [2, 3]  # the whole core, its product and its relu
    assert remat.nemo(graph, "full").planner == "full"

# ---- the optimal schedule is optimal ----

def random_dag(seed: int, n_ops: int):
    """A random graph of ``n_ops`` ag ops and a sum: matmuls, elementwise ops and adds of earlier values."""
    rng = np.random.default_rng(seed)
    x = ag.Tensor(rng.standard_normal((128, 64)).astype(np.float32))
    ws = [ag.Tensor((rng.standard_normal((64, 64)) * 0.1).astype(np.float32), requires_grad=True)
          for _ in range(n_ops)]
    choices = rng.integers(0, 4, size=n_ops)
    partners = rng.integers(0, 10**6, size=n_ops)

    def fn(x):
        values = [x]
        for k in range(n_ops):
            a = values[-1]
            kind = choices[k] if k else 0
            if kind == 0:
                values.append(a @ ws[k])
            elif kind == 1:
                values.append(ag.tanh(a))
            elif kind == 2:
                values.append(a + values[1 + partners[k] % (len(values) - 1)])
            else:
                values.append(ag.relu(a))
        return ag.sum(values[-1])
    return fn, (x,)


def brute_force(graph, budget: int) -> int | None:
    """The fewest recomputed FLOPs over all schedules whose every stage fits ``budget``, by
    exhaustive search over what each stage hands on to the next (for a choice of kept values,
    the cheapest computations are the missing ones the stage and the kept values need).
    None when nothing fits."""
    from ag.remat.graphs.checkmate import need_until
    n, T = graph.n, graph.stages
    flops = [node.flops for node in graph.nodes]
    until = need_until(graph)
    best: dict[frozenset, int] = {frozenset(): 0}
    for t in range(T):
        step = t - n if t >= n else None
        need = {t} if step is None else set(graph.steps[step].reads)
        candidates = sorted(i for i in range(n) if until[i] > t and (step is not None or i <= t))
        following: dict[frozenset, int] = {}
        for kept, cost in best.items():
            for r in range(len(candidates) + 1):
                for keep in itertools.combinations(candidates, r):
                    keep = frozenset(keep)
                    if any(graph.nodes[v].view_of is not None and graph.nodes[v].view_of not in keep for v in keep):
                        continue
                    computes = _closure(graph, need | keep, kept)
                    if step is None and any(i > t for i in computes):
                        continue
                    if stage_peak(graph, t, kept, computes, keep if t + 1 < T else set()) > budget:
                        continue
                    spent = cost + sum(flops[i] for i in computes if step is not None or i != t)
                    if spent < following.get(keep, 1 << 62):
                        following[keep] = spent
        best = following
        if not best:
            return None
    return min(best.values())


def _closure(graph, wanted, resident) -> set[int]:
    out, stack = set(), [i for i in wanted if i not in resident]
    while stack:
        i = stack.pop()
        if i not in out:
            out.add(i)
            stack.extend(d for d in graph.nodes[i].deps if d not in resident and d not in out)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_checkmate_agrees_with_brute_force_on_random_dags_of_at_most_8_nodes(seed):
    fn, inputs = random_dag(seed, n_ops=5 + seed % 3)  # 6 to 8 nodes with the loss
    graph = remat.capture(fn, *inputs)
    assert graph.n <= 8
    floor = remat.lower_bound_bytes(graph)
    none = remat.chain_schedule(graph, "keep all").predicted_peak_bytes
    for budget in np.linspace(floor, none, 5).astype(int):
        expected = brute_force(graph, int(budget))
        if expected is None:
            with pytest.raises(ValueError, match="smallest feasible budget"):
                remat.checkmate(graph, int(budget))
            continue
        found = remat.checkmate(graph, int(budget))
        assert found.status == "optimal"
        assert found.recompute_flops == expected, (seed, budget)
        assert found.predicted_peak_bytes <= budget


@pytest.mark.parametrize("name", ["residual MLP", "U-Net", "transformer (naive)", "transformer (flash)"])
def test_checkmate_recomputes_no_more_than_any_other_planner_at_its_budget(graphs, name):
    graph = graphs[name][0]
    for other in planners(graph):
        # the proof, not its speed, is the claim: the limit counts building and warm starts too, and the
        # residual MLP's tightest planner budget takes HiGHS about 50 s on 2 cores
        found = checkmate(graph, other.predicted_peak_bytes, time_limit=120)
        assert found.status == "optimal"
        assert found.recompute_flops <= other.recompute_flops, other
        assert found.predicted_peak_bytes <= other.predicted_peak_bytes


def test_checkmate_recomputes_nothing_at_the_no_remat_peak(graphs):
    for name in ("residual MLP", "U-Net", "transformer (naive)"):
        graph = graphs[name][0]
        found = checkmate(graph, remat.chain_schedule(graph, "keep all").predicted_peak_bytes)
        assert found.recompute_flops == 0 and found.status == "optimal" and found.gap == 0


def test_checkmate_beats_revolve_and_the_one_level_optimum_on_a_chain():
    fn, inputs, leaves = matmul_chain()
    graph = remat.capture(fn, *inputs)
    per_layer = graph.nodes[0].flops
    expected = plain_grads(fn, inputs, leaves)
    for slots in range(0, 7):
        plan = remat.revolve(8, slots)
        schedule = plan.schedule(graph)
        result, grads = run(schedule, leaves)
        assert result.recompute_flops == schedule.recompute_flops == plan.recomputed * per_layer
        assert abs(result.peak_bytes - schedule.predicted_peak_bytes) <= 0.05 * schedule.predicted_peak_bytes
        assert all(np.array_equal(a, b) for a, b in zip(grads, expected))
        found = checkmate(graph, schedule.predicted_peak_bytes)
        assert found.recompute_flops <= schedule.recompute_flops, slots
    compared = 0
    for slots in range(0, 7):  # one-level plans need more memory than revolve for the same recompute
        budget = remat.revolve(8, slots).schedule(graph).predicted_peak_bytes
        try:
            one_level = remat.chain_schedule(graph, "optimal", budget_bytes=budget)
        except ValueError:
            continue
        assert checkmate(graph, budget).recompute_flops <= one_level.recompute_flops
        compared += 1
    assert compared >= 3



def test_a_sweep_plans_the_chain_once_and_picks_what_chain_schedule_picks(graphs):
    from ag.remat.graphs.chain_plans import chain_plans, fitting
    from ag.remat.graphs.sweep import budgets_between, sweep
    graph = graphs["U-Net"][0]
    budgets = budgets_between(graph, 4)
    for strategy, name in (("greedy", "greedy"), ("optimal", "one-level optimal")):
        plans = chain_plans(graph, strategy)
        points = {p.budget_bytes: p for p in sweep(graph, budgets, planners=(name,))}
        fitted = 0
        for budget in budgets:
            try:
                direct = remat.chain_schedule(graph, strategy, budget_bytes=budget)
            except ValueError as error:
                with pytest.raises(ValueError, match=re.escape(str(error))):
                    fitting(plans, budget)
                assert budget not in points
                continue
            picked = fitting(plans, budget)
            assert picked.budget_bytes == budget and picked.planner == strategy
            assert np.array_equal(picked.R, direct.R) and np.array_equal(picked.S, direct.S)
            assert (points[budget].predicted_peak_bytes, points[budget].recompute_flops) == \
                (direct.predicted_peak_bytes, direct.recompute_flops)
            fitted += 1
        assert fitted >= 2, strategy
        assert all(p.budget_bytes is None for p in plans)  # picking copies: the plans stay as made
    with pytest.raises(ValueError, match="chain_plans: strategy must be 'greedy' or 'optimal', got 'sqrt'"):
        chain_plans(graph, "sqrt")


# ---- the budget is kept, and bad input is refused ----

def test_checkmate_never_predicts_more_than_its_budget(graphs):
    graph = graphs["U-Net"][0]
    floor = remat.lower_bound_bytes(graph)
    none = remat.chain_schedule(graph, "keep all").predicted_peak_bytes
    for budget in np.linspace(floor, none, 6).astype(int)[1:]:
        for relax in (False, True):
            try:
                found = remat.checkmate(graph, int(budget), relax=relax)
            except ValueError:
                assert relax
                continue
            assert found.predicted_peak_bytes <= budget
            assert found.budget_bytes == budget


def test_an_infeasible_budget_names_the_smallest_feasible_one(graphs):
    graph = graphs["residual MLP"][0]
    floor = remat.lower_bound_bytes(graph)
    with pytest.raises(ValueError, match=f"at least {floor:,} bytes"):
        remat.checkmate(graph, floor - 1)


def test_a_budget_below_the_inputs_is_refused(graphs):
    graph = graphs["residual MLP"][0]
    with pytest.raises(ValueError, match="below the .* bytes that the inputs and parameters hold"):
        remat.checkmate(graph, graph.leaf_bytes - 1)
    with pytest.raises(ValueError, match="at least the"):
        remat.dynamic(graph, graph.leaf_bytes - 1)


@pytest.mark.parametrize("limit", [0, -1, "60"])
def test_a_time_limit_that_is_not_positive_is_refused(graphs, limit):
    with pytest.raises(ValueError, match="time_limit must be a positive number"):
        remat.checkmate(graphs["residual MLP"][0], 10**9, time_limit=limit)


def test_a_time_limit_that_ends_before_any_schedule_gets_a_clear_error(graphs):
    graph = graphs["2-layer transformer"][0]
    budget = remat.lower_bound_bytes(graph) + 1
    with pytest.raises((TimeoutError, ValueError), match="time limit of 0.001 s ended|smallest feasible"):
        remat.checkmate(graph, budget, time_limit=0.001)


@pytest.mark.parametrize("limit", [0.5, 2.0])
def test_the_time_limit_is_one_deadline_in_wall_time_whichever_phase_it_ends_in(graphs, limit):
    """Warm starts, the covering bound, the MILP's build, the LP and HiGHS all spend from one clock:
    at the smallest budget not proved infeasible at once the solve outlasts the limit, and the answer
    (a schedule that fits, or a TimeoutError) comes within it, plus a deadline check's granularity
    and a killed HiGHS child."""
    graph = graphs["2-layer transformer"][0]
    budget = remat.carry_bound_bytes(graph)
    start = time.perf_counter()
    try:
        found = remat.checkmate(graph, budget, time_limit=limit)
    except TimeoutError:
        found = None
    assert time.perf_counter() - start <= limit + 1.5
    assert found is None or found.predicted_peak_bytes <= budget


def test_a_stopped_solve_reports_feasible_with_its_gap(graphs):
    graph = graphs["2-layer transformer"][0]
    selective = remat.nemo(graph, "selective")
    found = remat.checkmate(graph, selective.predicted_peak_bytes, time_limit=5)
    assert found.status in ("optimal", "feasible")
    assert found.recompute_flops <= selective.recompute_flops
    if found.status == "feasible":
        assert found.gap is not None and 0 <= found.gap <= 1 and found.lower_bound is not None


def test_a_schedule_that_reads_what_is_not_resident_is_refused(graphs):
    graph = graphs["residual MLP"][0]
    none = remat.chain_schedule(graph, "keep all")
    S = none.S.copy()
    S[graph.n:, :] = False  # keep nothing into backward, recompute nothing
    with pytest.raises(remat.ScheduleError, match="reads nodes"):
        remat.Schedule(graph, none.R, S, "broken")


def _prune_until_nothing_changes(graph, R, S):
    """prune's rule applied stage by stage, again and again, until a pass changes nothing."""
    R, S = R.copy(), S.copy()
    changed = True
    while changed:
        changed = False
        for t in range(graph.stages):
            used = set()
            for j in np.flatnonzero(R[t]).tolist():
                used |= graph.with_bases(graph.nodes[j].deps)
            if t >= graph.n:
                used |= graph.with_bases(graph.steps[t - graph.n].reads)
            if t + 1 < graph.stages:
                used |= graph.with_bases(np.flatnonzero(S[t + 1]).tolist())
            for i in np.flatnonzero(R[t]).tolist():
                if i != t and i not in used:
                    R[t, i], changed = False, True
            for i in np.flatnonzero(S[t]).tolist():
                if i not in used:
                    S[t, i], changed = False, True
    return R, S


@pytest.mark.parametrize("name", ["U-Net", "transformer (naive)"])
def test_prune_in_one_pass_drops_what_pruning_until_nothing_changes_drops(graphs, name):
    graph = graphs[name][0]
    rng = np.random.default_rng(0)
    for density in (0.1, 0.5, 0.9):
        R = rng.random((graph.stages, graph.n)) < density
        S = rng.random((graph.stages, graph.n)) < density
        R[np.arange(graph.n), np.arange(graph.n)] = True
        got, expected = prune(graph, R, S), _prune_until_nothing_changes(graph, R, S)
        assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]), density


# ---- the lecture's answer ----

@pytest.fixture(scope="module")
def layer():
    """Lecture 6.4's float16 transformer layer: its graph, NeMo's selective schedule and
    Checkmate's at selective's budget."""
    s, b, h, a = 128, 2, 64, 4
    model = nn.TransformerLayer(h, a, dtype=np.float16, dropout=0.1)
    x = ag.Tensor(np.random.default_rng(0).standard_normal((s, b, h)).astype(np.float16), requires_grad=True)
    graph = remat.capture(lambda x: ag.sum(model(x)), x)
    selective = remat.nemo(graph, "selective")
    found = remat.checkmate(graph, selective.predicted_peak_bytes)
    return (s, b, h, a), x, graph, selective, found


def test_checkmate_at_selectives_budget_recomputes_no_product_and_keeps_the_softmax_output(layer):
    (s, b, h, a), x, graph, selective, found = layer
    none = remat.chain_schedule(graph, "keep all")
    weights = graph.leaf_bytes - x.nbytes
    mask = a * s * s * b  # the attention dropout's mask: a captured graph keeps it (no seed to redraw it from)
    masks = mask + 2 * s * b * h  # with the residual dropouts' masks, which 34sbh counts
    objects = graph.hidden_bytes_at(graph.n) - masks  # each node's Tensor and closure, which the paper does not count
    assert 0 < objects < 1000 * graph.n
    assert kept_after_forward(selective) == (memory_model.activation_bytes_per_layer(s, b, h, a, recompute="selective")
                                             + weights + mask + objects)
    assert kept_after_forward(none) == memory_model.activation_bytes_per_layer(s, b, h, a) + weights + objects
    assert found.status == "optimal"
    assert selective.recompute_flops == 2 * (2 * s * s * h * b)  # the whole core again: QKᵀ and P·V
    assert found.recompute_flops == 0 and found.predicted_peak_bytes <= selective.predicted_peak_bytes
    softmax = next(node.index for node in graph.nodes if node.op == "scaled_masked_softmax")
    recomputed = {graph.nodes[i].op for i in found.recomputed()}
    assert softmax in selective.recomputed() and softmax not in found.recomputed()
    assert {"dropout", "layer_norm", "gelu"} <= recomputed


def test_both_schedules_peak_in_the_backward_of_p_times_v_and_a_tighter_budget_brings_qkt_back(layer):
    _, _, graph, selective, found = layer
    p_times_v = next(node for node in graph.nodes if node.op == "matmul" and any(
        graph.nodes[d].op == "dropout" for d in node.deps))
    for schedule in (selective, found):
        assert graph.steps[peak_step(schedule)].node == p_times_v.index
        assert schedule.peak_step() == peak_step(schedule)  # what lecture 6.4 prints
    tight = remat.checkmate(graph, selective.predicted_peak_bytes * 96 // 100, time_limit=120)  # the proof is the claim
    assert tight.status == "optimal" and tight.recompute_flops > selective.recompute_flops
    products = [graph.nodes[i] for i in tight.recomputed() if graph.nodes[i].flops]
    assert any(node.op == "matmul" and any(sc.startswith(remat.graphs.nemo.CORE) for sc in node.scope) for node in products)


def test_selective_reruns_the_whole_attention_core_and_drops_the_softmax_it_recomputes(layer):
    _, _, graph, selective, _ = layer
    core = [node.index for node in graph.nodes if any(sc.startswith(remat.graphs.nemo.CORE) for sc in node.scope)]
    ops = [graph.nodes[i].op for i in core]
    assert ops == ["transpose", "matmul", "scaled_masked_softmax", "dropout", "matmul"]  # Kᵀ, QKᵀ, P, drop(P), P·V
    assert selective.recomputed() == core
    softmax = core[2]
    assert softmax in selective.dropped()  # recomputed in P·V's step, kept from there to its own
    assert set(selective.dropped()) <= set(core)


def test_dropped_is_empty_when_every_value_is_kept_and_lists_everything_backward_reads_when_none_is(graphs):
    graph = graphs["residual MLP"][0]
    assert remat.chain_schedule(graph, "keep all").dropped() == []
    read = sorted({i for step in graph.steps for i in step.reads})
    assert remat.chain_schedule(graph, "keep none").dropped() == read


def replay(schedule):
    """The schedule's events under the memory model: (stage, memory) after each one."""
    from ag.remat.graphs.model import Memory, events
    memory, stage = Memory(schedule.graph), -1
    for kind, t, x in events(schedule.graph, schedule.R, schedule.S):
        if t != stage:
            stage = t
            memory.stage(t)
        getattr(memory, kind)(x)
        yield t, memory


def peak_step(schedule) -> int:
    """The backward step during which the schedule's predicted peak is reached."""
    from ag.remat.graphs.model import stage_step
    peak, at = 0, None
    for t, memory in replay(schedule):
        if memory.peak > peak:
            peak, at = memory.peak, stage_step(schedule.graph, t)
    assert peak == schedule.predicted_peak_bytes and at is not None
    return at


def kept_after_forward(schedule) -> int:
    """Bytes alive when backward starts: what the schedule keeps from forward, leaves included."""
    alive = schedule.graph.leaf_bytes
    for t, memory in replay(schedule):
        if t >= schedule.graph.n:
            break
        alive = memory.alive
    return alive


def test_bad_strategy_and_granularity_are_refused(graphs):
    graph = graphs["residual MLP"][0]
    with pytest.raises(ValueError, match="no node of this graph was made in an attention core"):
        remat.nemo(graph, "selective")
    with pytest.raises(ValueError, match="granularity must be"):
        remat.nemo(graph, "half")
    with pytest.raises(ValueError, match="heuristic must be one of"):
        remat.dynamic(graph, 10**9, heuristic="random")


def test_lecture_6_4_prints_what_its_comments_say(capsys):
    note = Path(__file__).resolve().parent.parent / "lectures" / "06-remat-on-graphs.md"
    section = note.read_text().split("## 6.4")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 3
    namespace = {}
    exec("import numpy as np\nimport ag\nfrom ag import remat", namespace)
    for block in blocks:
        capsys.readouterr()
        exec(compile(block, "lecture 6.4", "exec"), namespace)
        said = [line[2:] for line in block.splitlines() if line.startswith("# ")]
        assert capsys.readouterr().out.splitlines() == said


def test_execute_measures_the_predicted_peak_of_a_hundred_node_residual_mlp():
    """Issue 52: on small arrays (64 x 64 float32), execute's own bookkeeping must not be traced."""
    fn, inputs = examples.residual_mlp(blocks=33, batch=64, width=64)
    graph = remat.capture(fn, *inputs)
    schedule = remat.Schedule(graph, *keep_all(graph), "keep all")
    measured = remat.execute(schedule).peak_bytes
    assert graph.n > 100
    assert abs(measured - schedule.predicted_peak_bytes) <= 0.05 * schedule.predicted_peak_bytes, \
        (measured, schedule.predicted_peak_bytes)


@pytest.mark.parametrize("name", ["mlp101", "small transformer"])
def test_execute_measures_the_predicted_peak_of_a_tight_schedule_with_each_nodes_tensor_and_closure(name):
    """Issue 52: beside small values (64 x 64 float32; a 16 x 2 x 32 transformer), each node's Tensor
    and closure (hundreds of bytes, alive until its backward step) are part of the peak: the model
    counts them among its hidden bytes. At the tightest budget, grads as with no rematerialization."""
    if name == "mlp101":
        fn, inputs = examples.residual_mlp(blocks=33, batch=64, width=64)
        graph = remat.capture(fn, *inputs)
        budget = remat.lower_bound_bytes(graph)
        tight = remat.dynamic(graph, budget).schedule  # DTR's run as a schedule: keep_costly takes seconds here
    else:
        fn, inputs = examples.transformer(layers=2, s=16, b=2, h=32, a=2)
        graph = remat.capture(fn, *inputs)
        budget = remat.carry_bound_bytes(graph)
        tight = keep_costly(graph, budget)
    assert tight.predicted_peak_bytes <= budget and tight.recompute_flops > 0
    _, expected = run(remat.Schedule(graph, *keep_all(graph), "keep all"), fn.parameters)
    result, grads = run(tight, fn.parameters)
    assert abs(result.peak_bytes - tight.predicted_peak_bytes) <= 0.05 * tight.predicted_peak_bytes, \
        (result.peak_bytes, tight.predicted_peak_bytes)
    assert all(np.array_equal(a, b) for a, b in zip(grads, expected))


def test_execute_measures_the_same_peak_after_an_earlier_step_left_its_grads():
    """An earlier execute's grads stay on the leaves; the next step must not add into them (their
    bytes untraced: DTR's tightest mlp101 schedule measured 0.88 of its prediction the second time)."""
    fn, inputs = examples.residual_mlp(blocks=8, batch=64, width=64)
    graph = remat.capture(fn, *inputs)
    tight = remat.dynamic(graph, remat.lower_bound_bytes(graph)).schedule
    first, second = remat.execute(tight), remat.execute(tight)
    assert all(leaf.grad is not None for leaf in fn.parameters)
    assert abs(second.peak_bytes - first.peak_bytes) <= 0.01 * first.peak_bytes, (first.peak_bytes, second.peak_bytes)
    assert abs(first.peak_bytes - tight.predicted_peak_bytes) <= 0.05 * tight.predicted_peak_bytes
