"""ag.trace: the lecture's tracing functions and the timeline."""
import tracemalloc

import numpy as np
import pytest

import ag
from ag import trace


def test_snapshot_counts_only_numpy_buffers_allocated_since_start():
    before = np.ones(1000)
    trace.start_trace()
    after = np.ones(2000)
    python_junk = [str(i) for i in range(1000)]
    stats = trace.snapshot_trace()
    trace.end_trace()
    assert stats.allocated_bytes == after.nbytes
    assert before is not None and python_junk


def test_peak_catches_a_high_water_mark_between_snapshots():
    trace.start_trace()
    np.ones(1_000_000).sum()  # 8 MB, allocated and freed before any snapshot
    stats = trace.snapshot_trace()
    trace.end_trace()
    assert stats.allocated_bytes < 1000
    assert stats.peak_bytes >= 8_000_000


def test_print_trace_stats_rounds_down_to_whole_megabytes(capsys):
    trace.print_trace_stats(trace.Snapshot(allocated_bytes=32_999_999, peak_bytes=0))
    assert capsys.readouterr().out == "memory allocated: 32 MB\n"


def test_starting_twice_raises():
    trace.start_trace()
    with pytest.raises(trace.TraceError, match="already running"):
        trace.start_trace()
    trace.end_trace()


def test_ending_without_a_start_raises():
    with pytest.raises(trace.TraceError, match="not running"):
        trace.end_trace()


def test_a_users_own_tracemalloc_session_is_left_running_with_its_traces():
    tracemalloc.start()
    try:
        mine = np.ones(100_000)
        trace.start_trace()
        ours = np.ones(1000)
        stats = trace.snapshot_trace()
        trace.end_trace()
        assert tracemalloc.is_tracing()
        assert stats.allocated_bytes == ours.nbytes  # not the 800 KB that came before
        assert tracemalloc.get_object_traceback(mine) is not None
    finally:
        tracemalloc.stop()


def test_tracing_records_a_labelled_snapshot_per_op_and_per_backward_step(rng):
    x = ag.Tensor(rng.standard_normal((100, 10)))
    w = ag.Tensor(rng.standard_normal((10, 10)), requires_grad=True, name="w")
    with trace.tracing() as timeline:
        loss = ag.sum(ag.relu(x @ w))
        loss.backward()
    assert [(s.phase, s.op) for s in timeline] == [
        ("forward", "matmul"), ("forward", "relu"), ("forward", "sum"),
        ("backward", "sum"), ("backward", "relu"), ("backward", "matmul")]
    assert timeline[1].allocated_bytes == 2 * 100 * 10 * 8  # matmul output + relu output
    assert timeline[-1].allocated_bytes - w.value.nbytes < 100  # only w's grad (and the loss) left
    assert not trace.is_tracing()


def test_backward_trace_returns_one_snapshot_per_step(rng):
    w = ag.Tensor(rng.standard_normal(5), requires_grad=True)
    loss = ag.sum(ag.exp(w) * 2)
    trace.start_trace()
    steps = loss.backward(trace=True)
    trace.end_trace()
    assert [s.op for s in steps] == ["sum", "mul", "exp"]
    assert all(s.phase == "backward" for s in steps)


@pytest.mark.parametrize("checkpoints, mode", [(list(range(8)), "segment"), ([2, 5], "segment"), ([], "tensor")])
def test_the_category_accounting_agrees_with_tracemalloc_at_every_step(rng, checkpoints, mode):
    weights = [ag.Tensor(rng.standard_normal((64, 64)) / 8, requires_grad=True) for _ in range(8)]
    layers = [lambda h, w=w: ag.tanh(h @ w) for w in weights]
    x = ag.Tensor(rng.standard_normal((256, 64)))
    with trace.tracing() as timeline:
        ag.sum(ag.remat.sequential(layers, x, checkpoints, mode=mode)).backward()
    for snap in timeline:
        assert abs(sum(snap.categories.values()) - snap.allocated_bytes) <= 64, snap.label
    assert max(s.categories["activations kept"] for s in timeline) > 0
    assert max(s.categories["gradients"] for s in timeline) > 0
    if checkpoints != list(range(8)):
        assert max(s.categories["activations recomputed"] for s in timeline) > 0


def test_what_a_rematerializer_makes_counts_as_recomputed_not_kept(rng):
    weights = [ag.Tensor(rng.standard_normal((64, 64)) / 8, requires_grad=True) for _ in range(4)]
    layers = [lambda h, w=w: ag.tanh(h @ w) for w in weights]
    x = ag.Tensor(rng.standard_normal((256, 64)))
    with trace.tracing() as timeline:
        ag.sum(ag.remat.sequential(layers, x, [0], mode="segment")).backward()
    made_in_recompute = {b.key for s in timeline for b in s.buffers if b.phase == "recompute" and b.kind == "value"}
    assert made_in_recompute, "the segment was never recomputed"
    for snap in timeline:
        for b in snap.buffers:
            if b.key in made_in_recompute:
                assert b.category == "activations recomputed", (snap.label, b)


def test_a_grad_that_existed_before_the_timeline_is_not_counted_in_it(rng):
    w = ag.Tensor(rng.standard_normal((100, 100)), requires_grad=True)
    x = ag.Tensor(rng.standard_normal((10, 100)))
    ag.sum(x @ w).backward()
    with trace.tracing() as timeline:
        ag.sum(x @ w).backward()
    assert timeline[-1].categories["gradients"] == 0


def test_ops_run_by_a_rematerializer_are_labelled_recompute(rng):
    weights = [ag.Tensor(rng.standard_normal((4, 4)), requires_grad=True) for _ in range(3)]
    layers = [lambda h, w=w: h @ w for w in weights]
    with trace.tracing() as timeline:
        ag.sum(ag.remat.sequential(layers, ag.Tensor(rng.standard_normal((2, 4))), [])).backward()
    assert [s.phase for s in timeline].count("recompute") == 2  # x_0 and x_1, replayed for layer 2
    assert [s.phase for s in timeline][:4] == ["forward"] * 4


def test_eager_grads_are_counted_in_the_categories(rng):
    with ag.eager_grads(), trace.tracing() as timeline:
        ag.matmul(ag.Tensor(rng.standard_normal((100, 10))), ag.Tensor(rng.standard_normal((10, 10))))
    # the two leaves were made inside the timeline too: their values and their grads count
    assert timeline[-1].categories["gradients"] == timeline[-1].allocated_bytes // 2


# ---- a whole training step: parameters, gradients, optimizer state, activations, temporaries ----

def _mlp_step_with_adam(rng):
    """One training step of a two-layer MLP with Adam, model and optimizer made inside the timeline."""
    x = ag.Tensor(rng.standard_normal((32, 20)).astype(np.float32))
    with trace.tracing() as timeline:
        layers = [ag.nn.Linear(20, 30, seed=1, name="l1"), ag.nn.Linear(30, 5, seed=2, name="l2")]
        params = [p for layer in layers for p in layer.parameters()]
        opt = ag.optim.Adam(params, lr=1e-3)
        loss = ag.mean(ag.relu(layers[1](ag.relu(layers[0](x)))))
        loss.backward()
        grads = sum(p.grad.nbytes for p in params)
        opt.step()
        state = opt.state_bytes()
        opt.zero_grad()
    return timeline, params, grads, state, loss


def test_each_category_of_an_adam_step_is_exact_to_the_byte_and_they_sum_to_tracemalloc(rng):
    timeline, params, grads, state, loss = _mlp_step_with_adam(rng)
    weights = sum(p.nbytes for p in params)
    assert {s.phase for s in timeline} == {"forward", "backward", "optimizer step"}
    for snap in timeline:
        assert snap.categories["parameters"] == weights, snap.label
        assert sum(snap.categories.values()) == snap.allocated_bytes, snap.label
    after_backward = [s for s in timeline if s.phase == "backward"][-1]
    assert after_backward.categories["gradients"] == grads == weights
    assert after_backward.categories["optimizer state"] == 0  # allocated at the first step, as torch does
    last_step = [s for s in timeline if s.op == "Adam"][-1]
    assert last_step.categories["optimizer state"] == state == 2 * weights
    assert last_step.categories["activations kept"] == loss.value.nbytes  # only the loss is left
    assert last_step.categories["temporaries"] == 0  # the step's scratch is freed after each parameter
    assert timeline[-1].label == "optimizer step zero_grad" and timeline[-1].categories["gradients"] == 0


def test_optimizer_state_buffers_are_named_after_their_parameter(rng):
    timeline, *_ = _mlp_step_with_adam(rng)
    state = sorted(b.name for b in timeline[-1].buffers if b.category == "optimizer state")
    assert state == sorted(f"{layer}.{p}.{name}" for layer in ("l1", "l2") for p in ("weight", "bias")
                           for name in ("exp_avg", "exp_avg_sq"))
    assert all(b.kind == "state" and b.phase == "optimizer step" for b in timeline[-1].buffers
               if b.category == "optimizer state")


def test_bytes_no_tensor_holds_are_counted_as_temporaries(rng):
    x = ag.Tensor(rng.standard_normal(100))
    with trace.tracing() as timeline:
        scratch = np.ones(1000)
        ag.exp(x)
    assert timeline[-1].categories["temporaries"] == scratch.nbytes
    assert timeline[-1].categories["activations kept"] == x.nbytes


def test_state_allocated_before_the_timeline_is_not_counted_in_it(rng):
    w = ag.Tensor(rng.standard_normal((50, 50)), requires_grad=True)
    opt = ag.optim.Adam([w])
    ag.sum(w * w).backward()
    opt.step()
    with trace.tracing() as timeline:
        ag.sum(w * w).backward()
        opt.step()
    assert timeline[-1].categories["optimizer state"] == 0
