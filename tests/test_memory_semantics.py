"""The engine's six memory rules, each measured with tracemalloc."""
import numpy as np
import pytest

import ag
from ag import trace

B, D = 512, 256
ACT = B * D * 8      # one float64 activation of shape (B, D)
WEIGHT = D * D * 8   # one float64 weight (D, D)


def _params(rng, n_layers):
    x = ag.Tensor(rng.standard_normal((B, D)), name="x")
    weights = [ag.Tensor(rng.standard_normal((D, D)) / 16, requires_grad=True, name=f"w{i}")
               for i in range(n_layers)]
    return x, weights


def _forward(x, weights):
    """x -> x @ w_0 -> ... -> sum; returns the loss and every activation."""
    acts, h = [], x
    for w in weights:
        h = ag.matmul(h, w)
        acts.append(h)
    return ag.sum(h), acts


def _chain(rng, n_layers, keep=False):
    x, weights = _params(rng, n_layers)
    loss, acts = _forward(x, weights)
    return loss, weights, (acts if keep else None), x


def test_no_grad_buffer_is_allocated_in_forward(rng):
    x, weights = _params(rng, 3)
    trace.start_trace()
    loss, acts = _forward(x, weights)
    allocated = trace.snapshot_trace().allocated_bytes
    trace.end_trace()
    assert all(t.grad is None for t in [*weights, *acts, x, loss])
    # the three activations and the loss scalar, nothing else
    assert 3 * ACT <= allocated < 3 * ACT + 100


def test_backward_allocates_a_grad_the_first_time_something_flows_in(rng):
    loss, weights, _, _ = _chain(rng, 1)
    w = weights[0]
    assert w.grad is None
    trace.start_trace()
    loss.backward()
    allocated = trace.snapshot_trace().allocated_bytes
    trace.end_trace()
    assert w.grad is not None and w.grad.shape == w.shape
    # the value of h is freed with the graph; what is left is exactly w's new grad
    assert allocated - WEIGHT < 100


def test_a_non_leaf_grad_is_freed_right_after_its_own_backward_step(rng):
    loss, weights, acts, _ = _chain(rng, 4, keep=True)  # we hold every activation's value
    trace.start_trace()
    steps = loss.backward(trace=True)
    trace.end_trace()
    assert all(h.grad is None for h in acts)
    # after the matmul step of layer i: weight grads so far + only the grad of layer i's input
    matmul_steps = [s.allocated_bytes for s in steps[1:]]
    for k, allocated in enumerate(matmul_steps[:-1], start=1):
        assert allocated == k * WEIGHT + ACT, f"step {k}"
    assert matmul_steps[-1] == 4 * WEIGHT  # the input x needs no grad


def test_retain_grad_keeps_a_non_leaf_grad(rng):
    loss, weights, acts, _ = _chain(rng, 2, keep=True)
    acts[0].retain_grad()
    loss.backward()
    assert acts[0].grad is not None and acts[1].grad is None
    np.testing.assert_allclose(acts[0].grad, np.ones((B, D)) @ weights[1].value.T)


def test_no_gradient_is_computed_toward_tensors_that_do_not_require_grad(rng):
    x = ag.Tensor(rng.standard_normal((2000, 500)), name="X")
    w = ag.Tensor(rng.standard_normal((500, 2)), requires_grad=True, name="w")
    loss = ag.sum(ag.matmul(x, w))
    trace.start_trace()
    loss.backward()
    stats = trace.snapshot_trace()
    trace.end_trace()
    assert x.grad is None
    # an X-sized grad (8 MB) was never even computed transiently
    assert stats.peak_bytes < x.value.nbytes / 4
    assert stats.allocated_bytes - w.value.nbytes < 100


def test_a_branch_without_requires_grad_is_not_in_the_graph(rng):
    x = ag.Tensor(rng.standard_normal(3))
    w = ag.Tensor(rng.standard_normal(3), requires_grad=True)
    data_only = ag.exp(x) * 2
    out = ag.sum(data_only * w)
    assert not data_only.requires_grad and data_only.inputs == ()
    order = ag.topological_sort(out)
    assert all(t.requires_grad for t in order)
    assert data_only not in order


def test_leaves_keep_their_grad_and_repeated_backward_accumulates(rng):
    w = ag.Tensor(rng.standard_normal((3, 3)), requires_grad=True)
    x = rng.standard_normal((4, 3))
    ag.sum(ag.matmul(x, w)).backward()
    first = w.grad.copy()
    ag.sum(ag.matmul(x, w)).backward()
    np.testing.assert_array_equal(w.grad, 2 * first)
    w.zero_grad()
    assert w.grad is None
    ag.sum(ag.matmul(x, w)).backward()
    np.testing.assert_array_equal(w.grad, first)


def test_retain_graph_allows_a_second_backward_that_accumulates(rng):
    w = ag.Tensor(rng.standard_normal(3), requires_grad=True)
    loss = ag.sum(ag.exp(w))
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_allclose(w.grad, 2 * np.exp(w.value))


def test_backward_again_after_the_graph_was_freed_raises(rng):
    loss, weights, _, _ = _chain(rng, 2)
    loss.backward()
    with pytest.raises(ag.GraphError, match="freed by an earlier backward"):
        loss.backward()


def test_backward_from_a_second_root_through_a_freed_intermediate_raises(rng):
    w = ag.Tensor(rng.standard_normal(3), requires_grad=True)
    shared = ag.exp(w)
    first, second = ag.sum(shared * 2), ag.sum(shared * 3)
    first.backward()
    with pytest.raises(ag.GraphError, match="earlier backward"):
        second.backward()


def test_backward_through_a_discarded_value_raises_instead_of_returning_wrong_numbers(rng):
    w = ag.Tensor(rng.standard_normal(3), requires_grad=True)
    h = ag.exp(w)          # exp's backward reads its own output
    loss = ag.sum(h * 2)
    h.value = None         # discarded, and nothing can recompute it
    with pytest.raises(ag.GraphError, match="discarded and has no rematerializer"):
        loss.backward()


def test_eager_grads_mode_allocates_every_grad_in_the_constructor(rng):
    with ag.eager_grads():
        x = ag.Tensor(rng.standard_normal((B, D)))
        w = ag.Tensor(np.eye(D))
        trace.start_trace()
        h = ag.matmul(x, w)
        allocated = trace.snapshot_trace().allocated_bytes
        trace.end_trace()
        assert allocated == 2 * ACT  # h's value and h's grad
        ag.sum(h).backward()
    np.testing.assert_array_equal(x.grad, np.ones((B, D)))
    assert h.grad is not None  # never freed in the "before" engine


def _layer(rng, d_in=D):
    w = ag.Tensor(rng.standard_normal((d_in, D)) / 16, requires_grad=True)
    return w, ag.Tensor(np.zeros(D), requires_grad=True)


def test_a_value_no_backward_step_reads_is_freed_once_only_the_graph_holds_it(rng):
    x, (w, b) = ag.Tensor(rng.standard_normal((B, D))), _layer(rng)
    loss = ag.sum(ag.relu(x @ w + b))
    out = loss.inputs[0]
    biased = out.inputs[0]
    product = biased.inputs[0]
    assert (product.op, biased.op, out.op) == ("matmul", "add", "relu")
    assert product.value is None and biased.value is None  # add reads nothing, relu only its output
    assert out.value is not None and x.value is not None
    loss.backward()
    expected_mask = (x.value @ w.value + b.value) > 0
    np.testing.assert_allclose(w.grad, x.value.T @ expected_mask.astype(float))


def test_a_value_you_hold_a_name_for_is_kept_though_no_backward_step_reads_it(rng):
    x, (w, b) = ag.Tensor(rng.standard_normal((B, D))), _layer(rng)
    product = x @ w
    loss = ag.sum(ag.relu(product + b))
    assert product.value is not None and loss.inputs[0].inputs[0].value is None
    del product  # no op is built after it: backward frees it with the graph
    loss.backward()
    assert w.grad is not None


def test_an_mlp_written_as_relu_of_h_at_w_plus_b_peaks_at_what_backward_reads_plus_its_grads(rng):
    """relu(h @ w + b) for each layer, no linear, no release_unneeded: the step peaks in the last
    layer's matmul step, holding the relu outputs that backward reads, the incoming grad, the
    grad of the last relu output being made and the last layer's weight and bias grads."""
    n_layers = 4
    x = ag.Tensor(rng.standard_normal((B, D)))
    layers = [_layer(rng) for _ in range(n_layers)]
    trace.start_trace()
    h = x
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        if i < n_layers - 1:
            h = ag.relu(h)
    loss = ag.mean(h)
    del h
    loss.backward()
    peak = trace.snapshot_trace().peak_bytes
    trace.end_trace()
    kept = (n_layers - 1) * ACT          # the relu outputs: each read by its own step and the next matmul's
    grads = 2 * ACT + WEIGHT + D * 8     # the incoming grad, the one being made, the last w's and b's
    assert kept + grads <= peak < kept + grads + 64 * 1024  # and Python's own objects


def test_release_unneeded_keeps_exactly_what_backward_reads(rng):
    x = ag.Tensor(rng.standard_normal((B, D)))
    w = ag.Tensor(rng.standard_normal((D, D)), requires_grad=True)
    b = ag.Tensor(rng.standard_normal(D), requires_grad=True)
    pre = ag.matmul(x, w)      # read by nobody's backward (add reads no values)
    biased = pre + b           # read by nobody's backward (relu reads its output)
    out = ag.relu(biased)      # read by relu's own backward
    trace.start_trace()
    freed = ag.release_unneeded([out], [x])
    remaining = trace.snapshot_trace().allocated_bytes
    trace.end_trace()
    assert freed == 2 * ACT
    assert pre.value is None and biased.value is None and out.value is not None
    assert x.value is not None and w.value is not None
    ag.sum(out).backward()
    with ag.no_grad():
        expected_mask = (x.value @ w.value + b.value) > 0
    np.testing.assert_allclose(w.grad, x.value.T @ expected_mask.astype(float))
    assert remaining == 0


def _gelu_block(rng, release):
    x = ag.Tensor(rng.standard_normal((B, D)))
    w1 = ag.Tensor(rng.standard_normal((D, D)) / 16, requires_grad=True)
    w2 = ag.Tensor(rng.standard_normal((D, D)) / 16, requires_grad=True)
    a = ag.matmul(x, w1)   # read by gelu's backward
    g = ag.gelu(a)         # read by the second matmul's backward
    y = ag.matmul(g, w2)
    if release:
        ag.release_unneeded([y], [x])
    return ag.sum(y), (w1, w2), (a, g)


def test_backward_frees_a_value_inside_a_released_block_after_the_last_step_that_reads_it(rng):
    steps, weights, (a, g) = _traced_block(rng, release=True)
    assert g.value is None and a.value is None
    reference_steps, reference, _ = _traced_block(np.random.default_rng(0), release=False)
    # right after y = g @ w2's step (g's last reader), the run without the release still holds g
    matmul = next(i for i, s in enumerate(steps) if s.op == "matmul")
    assert reference_steps[matmul].op == "matmul"
    assert reference_steps[matmul].allocated_bytes - steps[matmul].allocated_bytes == ACT
    for w, r in zip(weights, reference):
        np.testing.assert_array_equal(w.grad, r.grad)


def _traced_block(rng, release):
    """Build the block and run its backward under tracemalloc: a snapshot after each step."""
    trace.start_trace()
    try:
        loss, weights, values = _gelu_block(rng, release)
        return loss.backward(trace=True), weights, values
    finally:
        trace.end_trace()


def test_retain_graph_keeps_a_released_blocks_values_for_a_second_backward(rng):
    loss, weights, (a, g) = _gelu_block(rng, release=True)
    loss.backward(retain_graph=True)
    assert a.value is not None and g.value is not None
    first = [w.grad.copy() for w in weights]
    loss.backward()
    for w, once in zip(weights, first):
        np.testing.assert_allclose(w.grad, 2 * once)


def test_gelus_backward_holds_one_temporary_beside_the_grad_it_hands_on(rng):
    x = ag.Tensor(rng.standard_normal((B, D)), requires_grad=True)
    y, dy = ag.gelu(x), np.ones((B, D))
    trace.start_trace()
    y.backward(dy)
    stats = trace.snapshot_trace()
    trace.end_trace()
    # the seed grad becomes x.grad in place; tanh's buffer is the one temporary
    assert 2 * ACT <= stats.peak_bytes < 2 * ACT + 64 * 1024
    assert stats.allocated_bytes - ACT < 1024  # only x.grad is left
