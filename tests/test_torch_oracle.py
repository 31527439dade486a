"""Every op's output and gradients agree with PyTorch autograd (float64, CPU), on the classroom
path and with the lab on (``each_path``)."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import ag
from gradcheck import BINARY_OPS, torch_check

# CI sets AG_REQUIRE_TORCH=1 so that a missing torch fails the run instead of skipping it
if os.environ.get("AG_REQUIRE_TORCH") is None:
    torch = pytest.importorskip("torch")
else:
    import torch
F = torch.nn.functional

pytestmark = [pytest.mark.oracle, pytest.mark.usefixtures("each_path")]

SEEDS = [0, 1]


def normal(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def positive(shape, seed=0):
    return np.random.default_rng(seed).uniform(0.5, 2.0, size=shape)


def dims(axis, ndim):
    """ag's axis (None, int or tuple) as torch's dim, which has no None for "every axis"."""
    return tuple(range(ndim)) if axis is None else axis


BROADCAST_PAIRS = [
    pytest.param((4, 3), (4, 3), id="same-shape"),
    pytest.param((), (3, 3), id="scalar-with-matrix"),
    pytest.param((3, 1), (3, 3), id="column-with-matrix"),
    pytest.param((1, 5), (4, 1), id="row-with-column"),
    pytest.param((4,), (2, 3, 4), id="rank-increasing"),
    pytest.param((2, 1, 4), (3, 1), id="both-stretched"),
]



# ---- elementwise binary ops ----

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("a_shape, b_shape", BROADCAST_PAIRS)
@pytest.mark.parametrize("op", BINARY_OPS)
def test_binary_op_matches_torch_under_broadcasting(op, a_shape, b_shape, seed):
    b = positive(b_shape, seed + 10) if op == "div" else normal(b_shape, seed + 10)
    torch_check(BINARY_OPS[op], BINARY_OPS[op], normal(a_shape, seed), b)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=3),
       seed=st.integers(0, 2**16))
@pytest.mark.parametrize("op", BINARY_OPS)
def test_binary_op_matches_torch_on_any_broadcastable_shapes(op, shapes, seed):
    a_shape, b_shape = shapes.input_shapes
    b = positive(b_shape, seed + 1) if op == "div" else normal(b_shape, seed + 1)
    torch_check(BINARY_OPS[op], BINARY_OPS[op], normal(a_shape, seed), b)


@pytest.mark.parametrize("seed", SEEDS)
def test_neg_matches_torch(seed):
    torch_check(lambda a: -a, lambda a: -a, normal((3, 4), seed))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("exponent", [2, 3, 0.5, -1, -0.5, 1.5])
def test_pow_matches_torch(exponent, seed):
    needs_positive = exponent != int(exponent) or exponent < 0
    x = positive((3, 4), seed) if needs_positive else normal((3, 4), seed)
    torch_check(lambda a: a ** exponent, lambda a: a ** exponent, x)


# ---- matrix product ----

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("a_shape, b_shape", [
    pytest.param((3, 4), (4, 2), id="matrix@matrix"),
    pytest.param((2, 3, 4), (2, 4, 5), id="batch@batch"),
    pytest.param((2, 1, 3, 4), (5, 4, 2), id="broadcast-leading-dims"),
    pytest.param((3, 4), (2, 4, 5), id="matrix@batch"),
    pytest.param((4,), (4, 3), id="vector@matrix"),
    pytest.param((3, 4), (4,), id="matrix@vector"),
    pytest.param((4,), (4,), id="vector@vector"),
    pytest.param((4,), (2, 4, 3), id="vector@batch"),
    pytest.param((2, 3, 4), (4,), id="batch@vector"),
])
def test_matmul_matches_torch(a_shape, b_shape, seed):
    torch_check(lambda a, b: a @ b, lambda a, b: a @ b,
                normal(a_shape, seed), normal(b_shape, seed + 10))


# ---- reductions ----

REDUCTIONS = {
    "sum": (ag.sum, torch.sum),
    "mean": (ag.mean, torch.mean),
    "max": (ag.max, torch.amax),
    "logsumexp": (ag.logsumexp, torch.logsumexp),
}


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 0, -1, -2, (0, 2), (-1, 0)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_reduction_matches_torch(reduction, axis, keepdims):
    ag_op, torch_op = REDUCTIONS[reduction]
    torch_check(lambda a: ag_op(a, axis=axis, keepdims=keepdims),
                lambda a: torch_op(a, dim=dims(axis, a.ndim), keepdim=keepdims),
                normal((2, 3, 4), seed=3))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4, 2)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_reduction_over_the_last_axis_matches_torch_on_other_shapes(reduction, shape, seed):
    ag_op, torch_op = REDUCTIONS[reduction]
    torch_check(lambda a: ag_op(a, axis=-1), lambda a: torch_op(a, dim=-1), normal(shape, seed))


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
def test_max_splits_the_grad_evenly_between_ties_like_torch_amax(axis):
    x = np.array([[1.0, 3.0, 3.0, 0.0],
                  [2.0, 2.0, 2.0, 2.0],
                  [3.0, 0.0, 3.0, 1.0]])
    torch_check(lambda a: ag.max(a, axis=axis), lambda a: torch.amax(a, dim=dims(axis, a.ndim)), x)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_family_matches_torch(op, axis, seed):
    torch_check(lambda a: getattr(ag, op)(a, axis=axis), lambda a: getattr(torch, op)(a, dim=axis),
                normal((2, 3, 4), seed) * 3)


def test_softmax_of_a_row_with_a_nan_is_nan_like_torch_and_a_fully_masked_row_is_zero():
    x = np.array([[1.0, np.nan, 2.0], [1.0, 2.0, 3.0], [-np.inf, -np.inf, -np.inf]])
    got = ag.softmax(ag.Tensor(x), axis=-1).value
    expected = torch.softmax(torch.from_numpy(x), dim=-1).numpy()
    np.testing.assert_array_equal(np.isnan(got[:2]), np.isnan(expected[:2]))
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-15)
    # torch gives NaN for a row with nothing visible; ag gives zeros (lecture 4, masking)
    np.testing.assert_array_equal(got[2], 0)


def _softmax_family_torch(op, x, axis):
    if op == "logsumexp":
        return torch.logsumexp(x, dim=axis, keepdim=True)
    if op.startswith("scaled_masked"):
        if op.endswith("causal"):
            n_q, n_k = x.shape[-2:]
            x = x.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(1), -torch.inf)
        return torch.softmax(x * 0.5, dim=axis)
    return getattr(torch, op)(x, dim=axis)


def _softmax_family_ag(op, x, axis):
    if op == "logsumexp":
        return ag.logsumexp(x, axis=axis, keepdims=True)
    if op.startswith("scaled_masked"):
        return ag.scaled_masked_softmax(x, 0.5, causal=op.endswith("causal"))
    return getattr(ag, op)(x, axis=axis)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp", "scaled_masked", "scaled_masked_causal"])
def test_peaked_softmax_family_matches_torch_and_the_lab_computes_no_subnormal_exp(monkeypatch, op, dtype):
    """Scores spread far beyond ln(tiny) (-87.3 in float32, -708.4 in float64): NumPy's exp would give
    subnormal numbers, which an Intel Xeon computes 14 times as slowly. On both paths the results
    match torch's; with the lab on, the exps of a pass without a mask give none (0 in their place),
    forward and backward (a pass holding a mask's -inf is left as NumPy computes it)."""
    import types
    from ag.lab import subnormals
    spread = {np.float32: 60.0, np.float64: 500.0}[dtype]
    x = (normal((3, 16, 16), seed=2) * spread).astype(dtype)
    axis = -1 if op.startswith("scaled_masked") else 1
    upstream = np.random.default_rng(3).standard_normal(x.shape if op != "logsumexp" else (3, 1, 16))
    counts = []

    def exp(a, out=None):
        result = np.exp(a, out=out)
        counts.append(int(np.count_nonzero((result > 0) & (result < np.finfo(result.dtype).tiny))))
        return result

    def run():
        counts.clear()
        t = ag.Tensor(x.copy(), requires_grad=True)
        out = _softmax_family_ag(op, t, axis)
        out.backward(upstream.astype(dtype))
        return out.value, t.grad, list(counts)
    monkeypatch.setattr(subnormals, "np", types.SimpleNamespace(**{**vars(np), "exp": exp}))
    if ag.lab.enabled():
        with monkeypatch.context() as unflushed:  # the same op without the flush: subnormal numbers
            unflushed.setattr(subnormals, "EXP_FLOOR", {})
            assert sum(run()[2]) > 0
    value, grad, counts = run()
    if ag.lab.enabled():
        assert counts and (sum(counts) == 0 or op.endswith("causal"))
    else:
        assert counts == []  # the classroom takes NumPy's exp, not the lab's
    monkeypatch.undo()
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    want = _softmax_family_torch(op, t, axis)
    want.backward(torch.from_numpy(upstream))
    rtol = {np.float32: 1e-5, np.float64: 1e-12}[dtype]
    # x - logsumexp(x) cancels: its error is a rounding of x's size, where softmax's is of 1's
    scale = np.abs(x).max() if op.startswith("log") else 1e-2
    np.testing.assert_allclose(value, want.detach().numpy(), rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(grad, t.grad.numpy(), rtol=rtol, atol=rtol * np.abs(upstream).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_flushed_trusts_a_lower_bound_it_is_given(dtype):
    from ag.lab.subnormals import EXP_FLOOR, exp_flushed
    floor = EXP_FLOOR[np.dtype(dtype)]
    x = np.array([0.0, -1.0, floor - 5.0], dtype)
    np.testing.assert_array_equal(exp_flushed(x.copy()), np.exp(x) * [1, 1, 0])
    np.testing.assert_array_equal(exp_flushed(x.copy(), lowest=floor - 5.0), np.exp(x) * [1, 1, 0])
    assert exp_flushed(x.copy(), lowest=0.0)[2] > 0  # a bound above the floor: no min, no flush
    masked = np.append(x, -np.inf).astype(dtype)  # a -inf, a mask: the softmax family's ops do not look further
    assert exp_flushed(masked.copy(), flush_masked=False)[2] > 0
    np.testing.assert_array_equal(exp_flushed(masked.copy()), np.exp(masked) * [1, 1, 0, 0])
    # the floor's next number, which flushed entries are raised to, has a normal e^x in NumPy's
    # vector loop too; the floor is ln(tiny) rounded down
    assert np.all(np.exp(np.full(64, np.nextafter(floor, dtype(0)))) >= np.finfo(dtype).tiny)
    assert floor <= np.log(np.float64(np.finfo(dtype).tiny)) < np.nextafter(floor, dtype(0))


# ---- elementwise unary ops ----

UNARY_OPS = {
    "exp": (ag.exp, torch.exp, normal),
    "log": (ag.log, torch.log, positive),
    "sqrt": (ag.sqrt, torch.sqrt, positive),
    "relu": (ag.relu, torch.relu, normal),
    "tanh": (ag.tanh, torch.tanh, normal),
    "sigmoid": (ag.sigmoid, torch.sigmoid, normal),
    "gelu": (ag.gelu, lambda a: F.gelu(a, approximate="tanh"), normal),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 4)])
@pytest.mark.parametrize("op", UNARY_OPS)
def test_unary_op_matches_torch(op, shape, seed):
    ag_op, torch_op, make_input = UNARY_OPS[op]
    torch_check(ag_op, torch_op, make_input(shape, seed))


def test_sigmoid_and_gelu_match_torch_at_large_magnitudes():
    x = np.array([-40.0, -12.0, -3.0, 0.0, 3.0, 12.0, 40.0])
    torch_check(ag.sigmoid, torch.sigmoid, x)
    torch_check(ag.gelu, lambda a: F.gelu(a, approximate="tanh"), x)


# ---- shape ops ----

@pytest.mark.parametrize("shape", [(6, 4), (4, 3, 2), (-1,), (2, -1, 3)])
def test_reshape_matches_torch(shape):
    torch_check(lambda a: ag.reshape(a, shape), lambda a: a.reshape(shape), normal((2, 3, 4)))


@pytest.mark.parametrize("axes", [None, (0, 2, 1), (2, 0, 1), (-1, 0, -2)])
def test_transpose_matches_torch(axes):
    torch_axes = (2, 1, 0) if axes is None else axes
    torch_check(lambda a: ag.transpose(a, axes), lambda a: a.permute(torch_axes), normal((2, 3, 4)))


def test_T_matches_torch():
    torch_check(lambda a: a.T, lambda a: a.T, normal((3, 4)))


def _reverse(n, step=1):
    return np.arange(n - 1, -1, -step)


@pytest.mark.parametrize("ag_index, torch_index", [
    pytest.param(1, 1, id="int"),
    pytest.param((1, -2), (1, -2), id="two-ints"),
    pytest.param((slice(None), slice(1, 3)), (slice(None), slice(1, 3)), id="slices"),
    pytest.param((None, 0), (None, 0), id="none-then-int"),
    pytest.param((Ellipsis, 1), (Ellipsis, 1), id="ellipsis-then-int"),
    pytest.param((0, Ellipsis, None), (0, Ellipsis, None), id="int-ellipsis-none"),
    pytest.param(slice(None, None, -1), _reverse(3), id="reversed"),
    pytest.param((slice(None), slice(None, None, -2)), (slice(None), _reverse(4, 2)),
                 id="step-minus-2"),
    pytest.param(np.array([0, 2, 0, 0]), np.array([0, 2, 0, 0]), id="int-array-with-repeats"),
    pytest.param((slice(None), np.array([3, 1, 3])), (slice(None), np.array([3, 1, 3])),
                 id="slice-then-int-array-with-repeats"),
    pytest.param((np.array([0, 0, 2]), np.array([1, 1, -1])),
                 (np.array([0, 0, 2]), np.array([1, 1, -1])),
                 id="paired-int-arrays"),
])
def test_getitem_matches_torch(ag_index, torch_index):
    def as_torch(i):
        return torch.from_numpy(i) if isinstance(i, np.ndarray) else i
    if isinstance(torch_index, tuple):
        index = tuple(map(as_torch, torch_index))
    else:
        index = as_torch(torch_index)
    torch_check(lambda a: a[ag_index], lambda a: a[index], normal((3, 4, 5)))


@pytest.mark.parametrize("axis, shapes", [
    pytest.param(0, [(2, 3), (1, 3), (4, 3)], id="axis-0"),
    pytest.param(-1, [(2, 3), (2, 1), (2, 2)], id="axis-minus-1"),
    pytest.param(1, [(2, 3, 4), (2, 2, 4)], id="axis-1-of-3"),
])
def test_concat_matches_torch(axis, shapes):
    arrays = [normal(shape, seed=i) for i, shape in enumerate(shapes)]
    torch_check(lambda *ts: ag.concat(list(ts), axis=axis),
                lambda *ts: torch.cat(ts, dim=axis), *arrays)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cond_shape, a_shape, b_shape", [
    pytest.param((3, 4), (3, 4), (3, 4), id="same-shapes"),
    pytest.param((3, 1), (3, 4), (4,), id="broadcast-condition"),
    pytest.param((2, 3, 4), (), (3, 4), id="condition-widest"),
    pytest.param((4,), (3, 1), (2, 1, 4), id="all-broadcast"),
])
def test_where_matches_torch(cond_shape, a_shape, b_shape, seed):
    condition = normal(cond_shape, seed + 20) > 0
    torch_check(lambda a, b: ag.where(condition, a, b),
                lambda a, b: torch.where(torch.from_numpy(condition), a, b),
                normal(a_shape, seed), normal(b_shape, seed + 10))


# ---- whole networks ----

def _mlp(x, w1, b1, w2, b2, w3, b3, labels, log_softmax, relu, mean):
    h = relu(x @ w1 + b1)
    h = relu(h @ w2 + b2)
    logp = log_softmax(h @ w3 + b3)
    return -mean(logp[np.arange(len(labels)), labels])


@pytest.mark.parametrize("seed", SEEDS)
def test_three_layer_mlp_gradients_match_torch(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=8)
    shapes = [(5, 16), (16,), (16, 16), (16,), (16, 4), (4,)]
    params = [rng.standard_normal(shape) * 0.5 for shape in shapes]

    def ag_loss(x, *params):
        return _mlp(x, *params, labels, lambda z: ag.log_softmax(z, axis=-1), ag.relu, ag.mean)

    def torch_loss(x, *params):
        return _mlp(x, *params, torch.from_numpy(labels), lambda z: torch.log_softmax(z, dim=-1),
                    torch.relu, torch.mean)
    torch_check(ag_loss, torch_loss, rng.standard_normal((8, 5)), *params)


def test_reused_tensor_matches_torch():
    def f(a):
        b = a + a
        return b * b + a @ a.T
    torch_check(f, f, normal((3, 3)))


GRAPH_STEPS = [
    lambda a, b, lib: a + b,
    lambda a, b, lib: a - b,
    lambda a, b, lib: a * b,
    lambda a, b, lib: -a,
    lambda a, b, lib: a.T,
    lambda a, b, lib: a.reshape(-1).reshape(a.shape),
    lambda a, b, lib: lib.tanh(a),
    lambda a, b, lib: (a @ b) * 0.3,
    lambda a, b, lib: a[np.array([0, 0, 1, 3])] if lib is ag else a[torch.tensor([0, 0, 1, 3])],
    lambda a, b, lib: a[::-1] if lib is ag else a.flip(0),
    lambda a, b, lib: (ag.concat([a, b], axis=0) if lib is ag else torch.cat([a, b]))[2:6] + a,
]


@pytest.mark.parametrize("seed", range(5))
def test_random_graphs_that_reuse_tensors_and_views_match_torch(seed):
    rng = np.random.default_rng(seed)
    # each step: which op, and which two earlier nodes (mod the count so far) it reads
    steps = [(rng.integers(len(GRAPH_STEPS)), rng.integers(100), rng.integers(100))
             for _ in range(15)]

    def build(lib):
        def f(*leaves):
            nodes = list(leaves)
            for step, i, j in steps:
                nodes.append(GRAPH_STEPS[step](nodes[i % len(nodes)], nodes[j % len(nodes)], lib))
            return nodes[-1] + nodes[-3] * nodes[len(nodes) // 2]
        return f
    torch_check(build(ag), build(torch), normal((4, 4), seed), normal((4, 4), seed + 10))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("x_shape", [(5, 3), (2, 4, 3)])
def test_linear_matches_torch(x_shape, seed):
    torch_check(ag.linear, lambda x, w, b: F.linear(x, w.T, b),
                normal(x_shape, seed), normal((3, 2), seed + 1), normal((2,), seed + 2))
