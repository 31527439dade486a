"""The graph and the backward walk: order, reuse, modes, rematerializers."""
from pathlib import Path

import numpy as np
import pytest

import ag

pytestmark = pytest.mark.usefixtures("each_path")  # the engine under the classroom's ops and the lab's


def _random_dag(rng, n_nodes):
    leaves = [ag.Tensor(rng.standard_normal(3), requires_grad=True) for _ in range(3)]
    nodes = list(leaves)
    for _ in range(n_nodes):
        a, b = (nodes[i] for i in rng.integers(0, len(nodes), size=2))
        nodes.append(ag.tanh(a * b + a))
    return ag.sum(nodes[-1] + nodes[len(nodes) // 2]), leaves


def test_topological_sort_puts_every_tensor_after_all_of_its_inputs(rng):
    root, _ = _random_dag(rng, 60)
    order = ag.topological_sort(root)
    position = {id(t): i for i, t in enumerate(order)}
    assert len(position) == len(order)  # each tensor once
    for t in order:
        for parent in t.inputs:
            assert position[id(parent)] < position[id(t)]
    assert order[-1] is root


def test_topological_sort_reaches_every_ancestor(rng):
    root, leaves = _random_dag(rng, 30)
    order = ag.topological_sort(root)
    reachable, stack = set(), [root]
    while stack:
        t = stack.pop()
        if id(t) not in reachable:
            reachable.add(id(t))
            stack.extend(t.inputs)
    assert {id(t) for t in order} == reachable


def test_a_chain_of_50000_ops_backpropagates_without_recursion():
    x = ag.Tensor(np.array(1.0), requires_grad=True)
    h = x
    for _ in range(50_000):
        h = h * 1.0
    h.backward()
    assert x.grad == 1.0


def test_a_reused_node_gets_the_sum_of_both_paths():
    a = ag.Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    b = a + a
    c = b * b
    ag.sum(c).backward()
    np.testing.assert_allclose(a.grad, 8 * a.value)  # c = 4a^2


def test_a_diamond_graph_counts_each_path_once():
    x = ag.Tensor(np.array(2.0), requires_grad=True)
    y = ag.exp(x)
    z = y * y + y  # z = e^{2x} + e^x
    z.backward()
    np.testing.assert_allclose(x.grad, 2 * np.exp(4.0) + np.exp(2.0))


def test_passing_the_output_grad_on_never_aliases_two_grads():
    a = ag.Tensor(np.ones(3), requires_grad=True)
    b = ag.Tensor(np.ones(3), requires_grad=True)
    s = a + b
    (ag.sum(s * 2) + ag.sum(a * 5)).backward()
    np.testing.assert_array_equal(a.grad, [7, 7, 7])
    np.testing.assert_array_equal(b.grad, [2, 2, 2])
    assert not np.shares_memory(a.grad, b.grad)


def test_a_retained_grad_is_not_handed_on_and_then_modified():
    a = ag.Tensor(np.ones(3), requires_grad=True)
    h = ag.exp(a) * 1.0
    s = h + 0.0
    s.retain_grad()
    out = ag.sum(s * 3) + ag.sum(h)
    out.backward()
    np.testing.assert_array_equal(s.grad, [3, 3, 3])


def test_backward_on_a_non_scalar_needs_an_explicit_grad():
    x = ag.Tensor(np.ones((2, 2)), requires_grad=True)
    y = x * 3
    with pytest.raises(ag.GraphError, match=r"shape \(2, 2\)"):
        y.backward()
    y.backward(np.full((2, 2), 0.5))
    np.testing.assert_allclose(x.grad, np.full((2, 2), 1.5))


def test_backward_with_a_grad_of_the_wrong_shape_raises():
    y = ag.Tensor(np.ones((2, 2)), requires_grad=True) * 3
    with pytest.raises(ag.GraphError, match=r"\(3,\).*\(2, 2\)"):
        y.backward(np.ones(3))


def test_backward_on_a_tensor_that_requires_no_grad_raises():
    with pytest.raises(ag.GraphError, match="does not require grad"):
        ag.sum(ag.Tensor(np.ones(3))).backward()


def test_no_grad_builds_no_graph():
    w = ag.Tensor(np.ones(3), requires_grad=True)
    with ag.no_grad():
        y = ag.exp(w) * 2
    assert not y.requires_grad and y.inputs == () and y._backward is None
    assert ag.config.grad_enabled


def test_an_ops_output_outside_any_graph_is_a_plain_tensor_with_its_op():
    value = np.arange(3.0)
    out = ag.exp(ag.Tensor(value))
    assert out.op == "exp" and not out.requires_grad and out.inputs == () and out._backward is None
    x = ag.Tensor(value, requires_grad=True)
    y = x * x
    assert y.requires_grad and y.inputs == (x, x) and y._saved == (x, x) and x._needed_by == 2
    with ag.eager_grads():  # under eager grads an op's output gets its grad buffer at birth
        assert ag.exp(ag.Tensor(value)).grad is not None


def test_tensor_keeps_the_dtype_it_was_given():
    for dtype in (np.float16, np.float32, np.float64, np.int32):
        assert ag.Tensor(np.zeros(2, dtype=dtype)).dtype == dtype


def test_a_float32_tensor_times_a_python_number_stays_float32():
    x = ag.Tensor(np.ones(2, dtype=np.float32), requires_grad=True)
    y = ag.sum(x * 2.5 + 1 - 0.5)
    assert y.dtype == np.float32
    y.backward()
    assert x.grad.dtype == np.float32


def test_grads_take_the_dtype_of_their_tensor_under_promotion():
    x = ag.Tensor(np.ones(2, dtype=np.float32), requires_grad=True)
    ag.sum(x * ag.Tensor(np.ones(2))).backward()  # float32 * float64 -> float64 output
    assert x.grad.dtype == np.float32


def test_operators_match_the_functions(rng):
    a = ag.Tensor(rng.standard_normal((3, 3)))
    b = ag.Tensor(rng.standard_normal((3, 3)))
    pairs = [(a + b, ag.add(a, b)), (a - b, ag.sub(a, b)), (a * b, ag.mul(a, b)),
             (a / b, ag.div(a, b)), (a @ b, ag.matmul(a, b)), (-a, ag.neg(a)),
             (a ** 2, ag.pow(a, 2)), (a.T, ag.transpose(a)), (a[1:], ag.getitem(a, slice(1, None))),
             (2 - a, ag.sub(2, a)), (1 / b, ag.div(1, b)), (a.value @ b, ag.matmul(a.value, b))]
    for op_result, fn_result in pairs:
        np.testing.assert_array_equal(op_result.value, fn_result.value)


@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float64, np.float64),
                                    (np.float32, np.float64)], ids=["float32", "float64", "mixed"])
def test_matmul_of_1d_and_2d_operands_equals_numpys_matmul(rng, dtypes, each_path):
    """The same shape and dtype as np.matmul, and the same numbers up to BLAS's rounding; bit for
    bit on plain matrices on the classroom path (one np.matmul), not in the lab's product blocks."""
    shapes = [((4, 4), (4, 4)), ((1, 7), (7, 3)), ((300, 65), (65, 129)), ((5, 4), (4,)),
              ((4,), (4, 6)), ((6,), (6,)), ((2, 3, 4), (4, 5))]
    for a_shape, b_shape in shapes:
        a = rng.standard_normal(a_shape).astype(dtypes[0])
        b = rng.standard_normal(b_shape).astype(dtypes[1])
        for x, y in [(a, b), (np.asfortranarray(a), b), (a, np.asfortranarray(b)), (a, b[::-1])]:
            out = ag.matmul(ag.Tensor(x), ag.Tensor(y)).value
            expected = np.matmul(x, y)
            assert out.dtype == expected.dtype and out.shape == expected.shape, (a_shape, b_shape)
            tolerance = 1e-5 if expected.dtype == np.float32 else 1e-13
            np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance,
                                       err_msg=f"{a_shape} @ {b_shape}")
        out = ag.matmul(ag.Tensor(a), ag.Tensor(b)).value
        if a.ndim == 2 and b.ndim == 2 and a.dtype == b.dtype and each_path == "classroom":
            np.testing.assert_array_equal(out, np.matmul(a, b), err_msg=f"{a_shape} @ {b_shape}")


def test_a_discarded_tensor_keeps_its_shape_and_dtype(rng):
    h = ag.tanh(ag.Tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True))
    h.value = None
    assert (h.shape, h.dtype, h.ndim, h.size, h.nbytes) == ((3, 4), np.float32, 2, 12, 0)
    assert "discarded" in repr(h)


def test_rematerializer_restores_a_discarded_value_for_backward(rng):
    x = ag.Tensor(rng.standard_normal(4))
    w = ag.Tensor(rng.standard_normal(4), requires_grad=True)
    h = ag.exp(w * x)  # exp reads its output in backward
    h.rematerializer = lambda: np.exp(w.value * x.value)
    loss = ag.sum(h * 3)
    assert h.value is None  # its consumer has run: not a checkpoint, so discarded
    loss.backward()
    np.testing.assert_allclose(w.grad, 3 * np.exp(w.value * x.value) * x.value)


def test_a_rematerializer_returning_the_wrong_shape_names_the_tensor(rng):
    w = ag.Tensor(rng.standard_normal(4), requires_grad=True)
    h = ag.exp(w)
    h.name = "h"
    h.rematerializer = lambda: np.zeros(5)
    loss = ag.sum(h)
    with pytest.raises(ag.GraphError, match=r"tensor 'h'.*shape \(5,\).*expected shape \(4,\)"):
        loss.backward()


def test_a_discarded_value_is_rematerialized_when_a_second_op_consumes_it(rng):
    w = ag.Tensor(rng.standard_normal(4), requires_grad=True)
    h = ag.exp(w)
    h.rematerializer = lambda: np.exp(w.value)
    first = ag.sum(h)          # consumes h: discarded
    assert h.value is None
    second = ag.sum(h * 2)     # beams it back, then discards it again
    assert h.value is None
    (first + second).backward()
    np.testing.assert_allclose(w.grad, 3 * np.exp(w.value))


def test_the_engine_calls_its_hooks_only_inside_a_watching_block_and_every_block_ends_cleanly():
    from ag import hooks, trace
    from ag.modes import config
    x = ag.Tensor(np.ones(3), requires_grad=True)
    seen = []
    with pytest.raises(RuntimeError):
        with trace.tracing() as timeline, hooks.record_tensors() as made, \
                hooks.subscribed("op run", lambda output, call: seen.append(output)), ag.count_ops() as counts:
            assert config.watchers == 4
            y = ag.tanh(x)
            ag.matmul(x, x)
            raise RuntimeError("the block fails")
    assert config.watchers == 0
    assert len(made) == 2 and made[0] is y and seen == made and counts.matmuls["forward"] == 1
    assert [s.label for s in timeline] == ["forward tanh", "forward matmul"]
    ag.exp(x @ x)  # nothing watches now
    assert len(made) == 2 and seen == made and counts.matmuls["forward"] == 1 and len(timeline) == 2


def test_under_eager_grads_a_traced_tensors_grad_is_named_after_its_value():
    from ag import trace
    with ag.eager_grads(), trace.tracing() as timeline:
        x = ag.Tensor(np.ones(3), requires_grad=True)
        ag.tanh(x)
    names = {(b.kind, b.name) for b in timeline[-1].buffers}
    for kind, name in list(names):
        assert ("value", name) in names and ("grad", name) in names, names


def test_the_phase_travels_as_events_and_count_ops_files_each_product_under_the_last_one_entered():
    from ag import hooks, scopes
    with ag.count_ops() as counts:
        hooks.publish("product counted", 10)
        with scopes.phase("backward"):
            hooks.publish("product counted", 20)
            with scopes.phase("recompute"):
                hooks.publish("product counted", 30)
            hooks.publish("product counted", 40)
        hooks.publish("product counted", 50)
    assert dict(counts.flops) == {"forward": 60, "backward": 60, "recompute": 30}
    assert dict(counts.matmuls) == {"forward": 2, "backward": 2, "recompute": 1}


def test_a_rematerializer_that_a_backward_step_needs_runs_in_a_recompute_phase_before_the_step():
    from ag import hooks
    x = ag.Tensor(np.ones((2, 2)), requires_grad=True)
    h = ag.matmul(x, x)
    h.rematerializer = lambda: x.value @ x.value
    y = ag.log(h)  # log saves its input: its backward step brings h back
    phases = []
    with hooks.subscribed("phase entered", lambda name: phases.append(("entered", name))), \
            hooks.subscribed("phase left", lambda name: phases.append(("left", name))):
        ag.sum(y).backward()
    assert phases == [("entered", "backward"), ("left", "backward"),  # sum's step
                      ("entered", "recompute"), ("left", "recompute"),  # log's step brings h back first
                      ("entered", "backward"), ("left", "backward"),
                      ("entered", "backward"), ("left", "backward")]  # matmul's step


def test_no_module_reads_the_phase_from_a_setting():
    assert not hasattr(ag.config, "phase")
    readers = [p.name for p in Path(ag.__file__).parent.rglob("*.py") if "config.phase" in p.read_text()]
    assert readers == []


def test_each_event_of_the_engine_reaches_its_subscribers_and_an_unknown_event_is_refused():
    from ag import hooks
    x = ag.Tensor(np.ones((2, 2)), requires_grad=True)
    seen = {event: [] for event in hooks.EVENTS}
    blocks = [hooks.subscribed(event, lambda *args, event=event: seen[event].append(args)) for event in hooks.EVENTS]
    for block in blocks:
        block.__enter__()
    try:
        y = ag.matmul(x, x)
        ag.sum(y).backward()
    finally:
        for block in reversed(blocks):
            block.__exit__(None, None, None)
    assert [args[0].op for args in seen["op run"]] == ["matmul", "sum"]
    assert [args[1] for args in seen["op run"]] == [(ag.matmul, x, x), (ag.sum, y, None, False)]
    assert seen["product counted"] == [(16,), (16,), (16,)]  # the FLOPs only: the phase is an event of its own
    assert seen["phase entered"] == seen["phase left"] == [("backward",), ("backward",)]
    assert [args[:2] for args in seen["step done"]] == [("sum", None), ("matmul", None)]
    assert [args[0] for args in seen["grad allocated"]] == [y, x]
    assert len(seen["tensor created"]) >= 2
    with pytest.raises(ValueError, match="no event named 'tensor made'; the events are tensor created"):
        hooks.subscribe("tensor made", print)
