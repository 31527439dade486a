"""Rematerialization: the lecture's rematerializer code and ag.remat.sequential."""
import numpy as np
import pytest

import ag
from ag import remat
from ag.remat.runner import Runner

N_LAYERS, BATCH, WIDTH = 10, 6, 5


@pytest.fixture
def weights(rng):
    return [ag.Tensor(rng.standard_normal((WIDTH, WIDTH)) / 2, requires_grad=True, name=f"w{i}")
            for i in range(N_LAYERS)]


@pytest.fixture
def x_value(rng):
    return rng.standard_normal((BATCH, WIDTH))


def lecture_forward(weights, x_value, checkpoints, wrong_slice=False, input_grad=False):
    """The slide's code: x = matmul(x, w) in a loop, a _rematerializer from the farthest checkpoint.

    ``checkpoints`` are layer indices whose outputs are kept; the input is always kept.
    The slide's slice ``weights[farthest_checkpoint:(i+1)]`` re-applies the checkpoint
    layer's own weight; the right slice starts one past it.
    """
    x = ag.Tensor(x_value, requires_grad=input_grad)
    outputs = []
    for i, w in enumerate(weights):
        x = ag.matmul(x, w)
        outputs.append(x)
        if i not in checkpoints:
            def _rematerializer(i=i):
                farthest_checkpoint = max([c for c in checkpoints if c < i], default=-1)
                y = x_value if farthest_checkpoint < 0 else outputs[farthest_checkpoint].value
                first = farthest_checkpoint if wrong_slice else farthest_checkpoint + 1
                for w in weights[max(first, 0):(i + 1)]:
                    y = ag.matmul(y, w.value).value
                return y
            x.rematerializer = _rematerializer
    return ag.sum(x), outputs


def grads(weights):
    return [w.grad.copy() for w in weights]


def test_lecture_rematerializer_gives_gradients_identical_to_no_rematerialization(weights, x_value):
    loss, _ = lecture_forward(weights, x_value, checkpoints=list(range(N_LAYERS)))
    loss.backward()
    expected = grads(weights)
    for w in weights:
        w.zero_grad()
    loss, outputs = lecture_forward(weights, x_value, checkpoints=[5])
    assert [o.value is None for o in outputs] == [i != 5 for i in range(N_LAYERS)]
    loss.backward()
    for got, want in zip(grads(weights), expected):
        np.testing.assert_array_equal(got, want)


def test_the_slides_slice_that_reapplies_the_checkpoint_weight_gives_wrong_gradients(weights, x_value):
    loss, _ = lecture_forward(weights, x_value, checkpoints=list(range(N_LAYERS)))
    loss.backward()
    expected = grads(weights)
    for w in weights:
        w.zero_grad()
    loss, _ = lecture_forward(weights, x_value, checkpoints=[5], wrong_slice=True)
    loss.backward()
    wrong = [not np.allclose(got, want) for got, want in zip(grads(weights), expected)]
    assert any(wrong)
    assert wrong[7:] == [True, True, True]  # layers after the checkpoint read a wrong input


def test_lecture_example_counts_30_matmuls_without_and_75_recomputing_all_from_the_input(weights, x_value):
    with ag.count_ops() as plain:
        lecture_forward(weights, x_value, list(range(N_LAYERS)), input_grad=True)[0].backward()
    with ag.count_ops() as from_input:
        lecture_forward(weights, x_value, [], input_grad=True)[0].backward()
    assert plain.total_matmuls == 30
    assert from_input.total_matmuls == 75
    assert from_input.matmuls["recompute"] == 45  # x_i for i = 0..8 costs i + 1 products


def test_ag_saves_one_product_when_the_input_needs_no_grad(weights, x_value):
    with ag.count_ops() as plain:
        lecture_forward(weights, x_value, list(range(N_LAYERS)))[0].backward()
    with ag.count_ops() as from_input:
        lecture_forward(weights, x_value, [])[0].backward()
    assert (plain.total_matmuls, from_input.total_matmuls) == (29, 74)


def _layers(weights):
    return [lambda h, w=w: ag.tanh(h @ w) for w in weights]


@pytest.mark.parametrize("mode", ["segment", "tensor"])
@pytest.mark.parametrize("checkpoints", [[], [5], [0, 3, 6, 9], [2, 5, 8], list(range(N_LAYERS))])
def test_sequential_gradients_are_bit_identical_to_no_rematerialization(weights, x_value, checkpoints, mode):
    x = ag.Tensor(x_value, requires_grad=True)
    ag.sum(remat.sequential(_layers(weights), x, list(range(N_LAYERS)))).backward()
    expected = grads(weights) + [x.grad.copy()]
    for t in [*weights, x]:
        t.zero_grad()
    ag.sum(remat.sequential(_layers(weights), x, checkpoints, mode=mode)).backward()
    for got, want in zip(grads(weights) + [x.grad], expected):
        np.testing.assert_array_equal(got, want)


def test_after_sequential_forward_exactly_the_non_checkpoint_outputs_are_discarded(weights, x_value):
    outputs = []
    layers = [lambda h, f=f: outputs.append(f(h)) or outputs[-1] for f in _layers(weights)]
    out = remat.sequential(layers, ag.Tensor(x_value), [2, 5])
    ag.sum(out)  # the last output is consumed too
    assert [o.value is None for o in outputs] == [i not in (2, 5) for i in range(N_LAYERS)]


def test_segment_mode_recomputes_each_run_once_and_tensor_mode_each_value_from_its_checkpoint(weights, x_value):
    layers = [lambda h, w=w: h @ w for w in weights]
    x = ag.Tensor(x_value)
    with ag.count_ops() as segment:
        ag.sum(remat.sequential(layers, x, [4], mode="segment")).backward()
    with ag.count_ops() as tensor:
        ag.sum(remat.sequential(layers, x, [4], mode="tensor")).backward()
    # backward needs x_0..x_8; x_4 is kept. Segment: layers 0-3 once, 5-8 once.
    assert segment.matmuls["recompute"] == 4 + 4
    # tensor: x_i costs i+1 products before the checkpoint and i-4 after it
    assert tensor.matmuls["recompute"] == (1 + 2 + 3 + 4) + (1 + 2 + 3 + 4)


def _computations(monkeypatch):
    """Spy on the one runner: (runner class, node, times computed before) for every node computed."""
    calls = []
    compute = Runner.compute

    def spy(self, k, x=None):
        calls.append((type(self).__name__, k, self.times[k]))
        return compute(self, k, x)
    monkeypatch.setattr(Runner, "compute", spy)
    return calls


def _chain(layers):
    def fn(h):
        for layer in layers:
            h = layer(h)
        return ag.sum(h)
    return fn


def test_sequential_and_execute_recompute_the_same_nodes_through_the_one_runner(weights, x_value, monkeypatch):
    layers = [lambda h, w=w: h @ w for w in weights]
    x = ag.Tensor(x_value)
    graph = remat.capture(_chain(layers), x)  # node k is layer k's product, as in the chain
    calls = _computations(monkeypatch)
    with ag.count_ops() as chained:
        ag.sum(remat.sequential(layers, x, [4], mode="segment")).backward()
    by_sequential, chain_grads = calls[:], grads(weights)
    del calls[:]
    for w in weights:
        w.grad = None
    ran = remat.execute(remat.from_keep(graph, [4]))
    for got, want in zip(grads(weights), chain_grads):
        np.testing.assert_array_equal(got, want)
    assert ran.recompute_flops == chained.flops["recompute"] > 0

    def recomputed(by, runner):
        return sorted(k for who, k, before in by if who == runner and before)
    assert recomputed(by_sequential, "Chain") == recomputed(calls, "Run") == [0, 1, 2, 3, 5, 6, 7, 8]
    assert {who for who, _, _ in by_sequential} == {"Chain"} and {who for who, _, _ in calls} == {"Run"}


def test_sequential_refuses_a_checkpoint_that_is_not_a_layer(weights, x_value):
    with pytest.raises(ValueError, match=r"checkpoint 10 is not a layer index in 0..9"):
        remat.sequential(_layers(weights), ag.Tensor(x_value), [10])


def test_a_layer_that_replays_differently_is_reported(weights, x_value):
    calls = []

    def moody(h):
        calls.append(1)
        return ag.tanh(h) if len(calls) == 1 else ag.exp(ag.tanh(h))
    loss = ag.sum(remat.sequential([moody, _layers(weights)[0]], ag.Tensor(x_value, requires_grad=True), []))
    with pytest.raises(ag.GraphError, match="replay of layer 0 made 2 tensors where the forward made 1"):
        loss.backward()


# ---- plan and predict ----

def test_plan_keep_all_keeps_every_output_and_keep_none_keeps_nothing_but_the_input():
    assert remat.plan(10, "keep all") == list(range(10))
    assert remat.plan(10, "keep none") == []
    assert remat.mode_for("keep none") == "tensor" and remat.mode_for("keep all") == "segment"


@pytest.mark.parametrize("old, new", [("none", "keep all"), ("all", "keep none")])
def test_the_old_backward_reading_plan_names_are_refused_with_the_new_one(old, new):
    with pytest.raises(ValueError, match=rf"plan: unknown strategy '{old}' \(now '{new}': a name says what it "
                                         r"keeps\); choose one of keep all, keep none, uniform"):
        remat.plan(10, old)
    with pytest.raises(ValueError, match=rf"mode_for: strategy '{old}' is now '{new}'"):
        remat.mode_for(old)


def test_plan_uniform_keeps_the_input_of_every_block_of_num_layers():
    assert remat.plan(10, "uniform", num_layers=3) == [2, 5, 8]
    assert remat.plan(12, "uniform", num_layers=4) == [3, 7]  # the chain's output starts no block


def test_plan_block_recomputes_only_the_first_num_layers():
    assert remat.plan(10, "block", num_layers=4) == [3, 4, 5, 6, 7, 8, 9]


def test_plan_sqrt_keeps_every_floor_sqrt_n_th_output():
    assert remat.plan(64, "sqrt") == [7, 15, 23, 31, 39, 47, 55]
    assert remat.plan(10, "sqrt") == [2, 5, 8]


@pytest.mark.parametrize("kwargs, message", [
    (dict(strategy="fastest"), "unknown strategy 'fastest'"),
    (dict(strategy="uniform"), "needs num_layers in 1..10"),
    (dict(strategy="optimal"), "needs chain="),
])
def test_plan_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        remat.plan(10, **kwargs)


def _random_profile(seed, n):
    rng = np.random.default_rng(seed)
    return remat.ChainProfile(tuple(int(v) for v in rng.integers(1, 10, n) * 1000),
                              tuple(int(v) for v in rng.integers(1, 10, n)))


def _brute_force(profile, budget):
    import itertools
    best = None
    for r in range(profile.n + 1):
        for kept in itertools.combinations(range(profile.n), r):
            cost = remat.predict(profile, kept)
            if cost.peak_bytes <= budget and (best is None or cost.recompute_flops < best):
                best = cost.recompute_flops
    return best


@pytest.mark.parametrize("seed", range(4))
def test_optimal_matches_brute_force_on_small_heterogeneous_chains(seed):
    profile = _random_profile(seed, 9)
    full = remat.predict(profile, range(9)).peak_bytes
    for budget in np.linspace(full * 0.5, full, 8).astype(int):
        best = _brute_force(profile, budget)
        if best is None:
            with pytest.raises(ValueError, match="no checkpoint plan"):
                remat.plan(9, "optimal", chain=profile, budget_bytes=budget)
            continue
        kept = remat.plan(9, "optimal", chain=profile, budget_bytes=budget)
        cost = remat.predict(profile, kept)
        assert cost.peak_bytes <= budget and cost.recompute_flops == best


def _local_peak_step_by_step(s, c, j):
    """The optimal plan's local peak as its docstring states it, each step summed afresh."""
    n, peak = len(s), 0
    for k in range(c + 1, min(j, n - 1) + 1):  # forward: the input (if not kept) and the output
        peak = max(peak, (s[k - 1] if k - 1 > c else 0) + s[k])
    for m in range(c + 1, min(j, n - 1) + 1):  # backward: j kept, layers c+1..m-1 replayed, grads
        peak = max(peak, (s[j] if j < n and m == j else 0) + sum(s[c + 1:m]) + s[m] + (s[m - 1] if m > 0 else 0))
    return peak


@pytest.mark.parametrize("seed", range(3))
def test_local_peaks_worked_out_together_equal_each_one_step_by_step(seed):
    from ag.remat.chains.plans import _local_peak
    rng = np.random.default_rng(seed)
    for n in (1, 2, 5, 13):
        sizes = tuple(int(x) for x in rng.integers(1, 1000, n))
        for c in range(-1, n):
            for j in range(c + 1, n + 1):
                assert _local_peak(sizes, c, j) == _local_peak_step_by_step(sizes, c, j), (sizes, c, j)
                assert _local_peak(list(sizes), c, j) == _local_peak_step_by_step(sizes, c, j)


@pytest.mark.parametrize("seed", range(3))
def test_optimal_is_never_worse_than_sqrt_or_greedy_at_the_same_budget(seed):
    n = 40
    profile = _random_profile(seed, n)
    candidates = [remat.plan(n, "sqrt")]
    budgets = sorted({remat.predict(profile, k).peak_bytes for k in candidates} |
                     set(np.linspace(remat.predict(profile, []).peak_bytes * 0.6,
                                     remat.predict(profile, range(n)).peak_bytes, 12).astype(int)))
    for budget in budgets:
        rivals = [k for k in candidates if remat.predict(profile, k).peak_bytes <= budget]
        try:
            rivals.append(remat.plan(n, "greedy", chain=profile, budget_bytes=budget))
        except ValueError:
            pass
        if not rivals:
            continue
        optimal = remat.predict(profile, remat.plan(n, "optimal", chain=profile, budget_bytes=budget))
        assert optimal.peak_bytes <= budget
        for rival in rivals:
            assert optimal.recompute_flops <= remat.predict(profile, rival).recompute_flops


def test_predict_counts_the_lectures_45_recomputed_layers_for_all_in_tensor_mode():
    cost = remat.predict([1] * 10, [], mode="tensor")
    assert cost.recompute_layers == 45


def test_predict_counts_one_extra_forward_for_segment_mode():
    cost = remat.predict([1] * 10, remat.plan(10, "sqrt"))
    assert cost.recompute_layers == 9 - 3  # x_0..x_8 are read by backward; 2, 5, 8 are kept


def _closed_form(s, costs, kept, mode):
    """Lecture 3's sum, step by step: forward holds the kept outputs, the layer's input and its
    output; backward step m the kept outputs up to m, the replayed run, x_m's and x_{m-1}'s grads."""
    n, peak, flops, layers = len(s), 0, 0, 0
    kept_up_to = lambda m: sum(s[i] for i in kept if i <= m)  # noqa: E731
    for k in range(n):
        peak = max(peak, kept_up_to(k - 1) + (s[k - 1] if k > 0 and k - 1 not in kept else 0) + s[k])
    for m in range(n - 1, -1, -1):
        grads = s[m] + (s[m - 1] if m > 0 else 0)
        run = range(max([c for c in kept if c < m - 1], default=-1) + 1, m) if m > 0 and m - 1 not in kept else ()
        if mode == "segment":
            step = sum(s[i] for i in run) + grads
        else:
            walk = max((s[i] + s[i + 1] for i in run if i + 1 < m), default=0)
            step = s[m] + max(walk, s[m - 1] + s[m - 1]) if run else grads
            flops, layers = flops + sum(costs[i] for i in run), layers + len(run)
        peak = max(peak, kept_up_to(m) + step)
    if mode == "segment":
        replayed = [i for i in range(n - 1) if i not in kept]
        flops, layers = sum(costs[i] for i in replayed), len(replayed)
    return peak, flops, layers


@pytest.mark.parametrize("mode", ["segment", "tensor"])
def test_predict_prices_every_plan_of_small_chains_as_the_lectures_closed_form(mode):
    import itertools
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 6):
        for _ in range(3):
            s = [int(v) for v in rng.integers(1, 10, n)]
            costs = [int(v) for v in rng.integers(1, 10, n)]
            for r in range(n + 1):
                for kept in itertools.combinations(range(n), r):
                    got = remat.predict(remat.ChainProfile(tuple(s), tuple(costs)), kept, mode=mode)
                    want = _closed_form(s, costs, set(kept), mode)
                    assert (got.peak_bytes, got.recompute_flops, got.recompute_layers) == want, (s, kept)


def test_a_chain_plan_is_a_schedule_whose_steps_read_the_layer_input_and_a_kept_output():
    schedule = remat.sequential_schedule([4, 1, 1, 4], [1], mode="segment")
    assert [step.reads for step in schedule.graph.steps] == [(2,), (1,), (0, 1), ()]
    assert schedule.recomputed() == [0, 2]  # x_2 for step 3, x_0 for step 1; x_3 is read by no step
    assert schedule.prediction == remat.simulate(schedule.graph, schedule.R, schedule.S)


def test_sequential_schedule_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="mode must be 'segment' or 'tensor', got 'chen'"):
        remat.sequential_schedule([1, 1], [0], mode="chen")


# ---- measured against predicted ----

MEASURE_N, MEASURE_B, MEASURE_D = 16, 2048, 64  # activations 1 MB each, weights 32 KB


@pytest.fixture(scope="module")
def matmul_chain():
    rng = np.random.default_rng(3)
    weights = [ag.Tensor(rng.standard_normal((MEASURE_D, MEASURE_D)) / 8, requires_grad=True)
               for _ in range(MEASURE_N)]
    layers = [lambda h, w=w: h @ w for w in weights]
    x = ag.Tensor(rng.standard_normal((MEASURE_B, MEASURE_D)))
    ag.sum(remat.sequential(layers, x, list(range(MEASURE_N)))).backward()  # weights' grads exist now
    return layers, x


def measured_peak(layers, x, checkpoints, mode):
    ag.trace.start_trace()
    loss = ag.sum(remat.sequential(layers, x, checkpoints, mode=mode))
    loss.backward()
    peak = ag.trace.snapshot_trace().peak_bytes
    ag.trace.end_trace()
    return peak


@pytest.mark.parametrize("strategy, options", [
    ("keep all", {}), ("keep none", {}), ("sqrt", {}), ("uniform", {"num_layers": 3}), ("block", {"num_layers": 6})])
def test_predicted_peak_is_within_5_percent_of_tracemalloc(matmul_chain, strategy, options):
    layers, x = matmul_chain
    kept = remat.plan(MEASURE_N, strategy, **options)
    mode = remat.mode_for(strategy)
    predicted = remat.predict(remat.profile(layers, x), kept, mode=mode).peak_bytes
    assert measured_peak(layers, x, kept, mode) == pytest.approx(predicted, rel=0.05)


@pytest.mark.parametrize("strategy, mode", [("sqrt", "segment"), ("uniform", "segment"), ("keep none", "tensor")])
def test_the_schedule_of_a_plan_recomputes_as_many_products_as_sequential_runs(matmul_chain, strategy, mode):
    layers, x = matmul_chain
    kept = remat.plan(MEASURE_N, strategy, **({"num_layers": 3} if strategy == "uniform" else {}))
    with ag.count_ops() as counts:
        ag.sum(remat.sequential(layers, x, kept, mode=mode)).backward()
    schedule = remat.sequential_schedule([1] * MEASURE_N, kept, mode=mode)
    assert counts.matmuls["recompute"] == schedule.prediction.recompute_layers > 0


def test_a_one_layer_chain_keeping_its_output_holds_it_beside_its_grad_in_backward(matmul_chain):
    layers, x = matmul_chain
    act = MEASURE_B * MEASURE_D * 8
    assert remat.predict(remat.profile(layers[:1], x), [0]).peak_bytes == 2 * act
    assert measured_peak(layers[:1], x, [0], "segment") == pytest.approx(2 * act, rel=0.05)


def test_measured_peaks_order_none_above_uniform_and_sqrt_above_all(matmul_chain):
    layers, x = matmul_chain
    peak = {s: measured_peak(layers, x, remat.plan(MEASURE_N, s, **o), remat.mode_for(s))
            for s, o in [("keep all", {}), ("uniform", {"num_layers": 4}), ("sqrt", {}), ("keep none", {})]}
    assert peak["keep all"] > peak["uniform"] > peak["keep none"]
    assert peak["keep all"] > peak["sqrt"] > peak["keep none"]


def test_the_optimal_plan_stays_under_its_budget_when_measured(matmul_chain):
    layers, x = matmul_chain
    profile = remat.profile(layers, x)
    budget = remat.predict(profile, range(MEASURE_N)).peak_bytes // 2
    kept = remat.plan(MEASURE_N, "optimal", chain=profile, budget_bytes=budget)
    # the model leaves out the weights' transient grads (32 KB each): allow that much
    assert measured_peak(layers, x, kept, "segment") <= budget + 2 * MEASURE_D * MEASURE_D * 8


# ---- dynamic eviction ----

def test_dynamic_gradients_are_bit_identical_and_it_recomputes_under_a_tight_budget(weights, x_value):
    x = ag.Tensor(x_value, requires_grad=True)
    ag.sum(remat.sequential(_layers(weights), x, list(range(N_LAYERS)))).backward()
    expected = grads(weights) + [x.grad.copy()]
    act = BATCH * WIDTH * 8
    for budget in (100 * act, 4 * act, 2 * act):
        for t in [*weights, x]:
            t.zero_grad()
        with ag.count_ops() as counts:
            ag.sum(remat.dynamic(_layers(weights), x, budget)).backward()
        for got, want in zip(grads(weights) + [x.grad], expected):
            np.testing.assert_array_equal(got, want)
        assert (counts.matmuls["recompute"] > 0) == (budget < N_LAYERS * act)


def test_dynamic_peak_follows_its_budget(matmul_chain):
    layers, x = matmul_chain
    act = MEASURE_B * MEASURE_D * 8
    peaks = []
    for budget in (16 * act, 8 * act, 4 * act):
        ag.trace.start_trace()
        ag.sum(remat.dynamic(layers, x, budget)).backward()
        peaks.append(ag.trace.snapshot_trace().peak_bytes)
        ag.trace.end_trace()
        # the budget holds the chain's resident activations; the step's grads come on top
        assert peaks[-1] <= budget + 4 * act
    assert peaks[0] > peaks[1] > peaks[2]


@pytest.mark.parametrize("strategy, options", [
    ("keep all", {}), ("keep none", {}), ("uniform", {"num_layers": 3}), ("block", {"num_layers": 4}),
    ("sqrt", {}), ("greedy", {"budget": 0.7}), ("optimal", {"budget": 0.6})])
def test_every_strategy_gives_gradients_bit_identical_to_none(weights, x_value, strategy, options):
    x = ag.Tensor(x_value, requires_grad=True)
    layers = _layers(weights)
    ag.sum(remat.sequential(layers, x, remat.plan(N_LAYERS, "keep all"))).backward()
    expected = grads(weights) + [x.grad.copy()]
    for t in [*weights, x]:
        t.zero_grad()
    if "budget" in options:
        profile = remat.profile(layers, x)
        full = remat.predict(profile, range(N_LAYERS)).peak_bytes
        options = {"chain": profile, "budget_bytes": int(full * options["budget"])}
    kept = remat.plan(N_LAYERS, strategy, **options)
    ag.sum(remat.sequential(layers, x, kept, mode=remat.mode_for(strategy))).backward()
    for got, want in zip(grads(weights) + [x.grad], expected):
        np.testing.assert_array_equal(got, want)


def test_greedy_keeps_every_output_when_the_budget_allows_it():
    profile = _random_profile(5, 12)
    budget = remat.predict(profile, range(12)).peak_bytes
    kept = remat.plan(12, "greedy", chain=profile, budget_bytes=budget)
    assert remat.predict(profile, kept).recompute_flops == 0


# ---- the function form: remat.checkpoint ----

def _tanh_block(rng, retain: bool = False):
    """y = checkpoint(3·tanh(x @ w), x) and loss = Σ y, on 256 × 256 float64 arrays (A bytes each)."""
    x = ag.Tensor(rng.standard_normal((256, 256)), requires_grad=True)
    w = ag.Tensor(rng.standard_normal((256, 256)) / 16, requires_grad=True)
    y = remat.checkpoint(lambda x: ag.tanh(x @ w) * 3.0, x)
    if retain:
        y.retain_grad()
    return x, w, y, ag.sum(y)


def test_checkpoint_backward_holds_neither_a_copy_of_its_output_grad_nor_the_rerun_output(rng):
    """In the rerun's backward, tanh's value and its grad are all there is (2 A): the output's grad
    became the rerun's, uncopied, and went with its first step, and the rerun's output 3·t, which
    no step reads, went before the step (4 A when both were held). The step's peak is the rerun's
    forward: the output's grad, x @ w, t and 3·t (4 A)."""
    A = 256 * 256 * 8
    x, w, y, loss = _tanh_block(rng)
    with ag.trace.tracing() as timeline:
        loss.backward()
    at = {s.label: s for s in timeline}
    assert round(at["backward mul"].allocated_bytes / A, 1) == 2.0
    assert round(at["backward tanh"].allocated_bytes / A, 1) == 1.0  # x @ w's grad
    assert round(timeline[-1].peak_bytes / A, 1) == 4.0


def test_checkpoint_gradients_are_the_plain_ones_and_a_retained_output_grad_stays_intact(rng):
    for retain in (False, True):
        x, w, y, loss = _tanh_block(np.random.default_rng(7), retain)
        loss.backward()
        t = np.tanh(x.value @ w.value)
        g = 3.0 * (1 - t * t)
        assert np.allclose(x.grad, g @ w.value.T, rtol=1e-12) and np.allclose(w.grad, x.value.T @ g, rtol=1e-12)
        if retain:  # not handed to the rerun, whose first step would have scaled it in place
            assert np.array_equal(y.grad, np.ones_like(y.value))


def test_checkpoint_of_a_block_that_returns_its_input_passes_the_grad_through(rng):
    x = ag.Tensor(rng.standard_normal(5), requires_grad=True)
    ag.sum(remat.checkpoint(lambda x: x, x) * 2.0).backward()
    assert np.array_equal(x.grad, np.full(5, 2.0))
