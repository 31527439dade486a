"""Every op's backward agrees with central finite differences (float64, fixed seeds), on the
classroom path and with the lab on (``each_path``)."""
import math

import numpy as np
import pytest

import ag
from gradcheck import BINARY_OPS, grad_check

pytestmark = pytest.mark.usefixtures("each_path")


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def positive(*shape, seed=0):
    return np.random.default_rng(seed).uniform(0.5, 2.0, size=shape)


def away_from_zero(*shape, seed=0):
    """Values with |x| >= 0.2, so a kink at 0 (relu) is never inside a finite-difference step."""
    rng = np.random.default_rng(seed)
    return rng.uniform(0.2, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)


BROADCAST_PAIRS = [
    pytest.param((3, 3), (3, 3), id="same-shape"),
    pytest.param((), (3, 3), id="scalar-with-matrix"),
    pytest.param((3, 3), (), id="matrix-with-scalar"),
    pytest.param((3, 1), (3, 3), id="column-with-matrix"),
    pytest.param((1, 3), (3, 1), id="row-with-column"),
    pytest.param((4,), (2, 3, 4), id="rank-increasing"),
    pytest.param((2, 3, 4), (3, 1), id="rank-increasing-and-stretched"),
]



# ---- elementwise binary ops ----

@pytest.mark.parametrize("a_shape, b_shape", BROADCAST_PAIRS)
@pytest.mark.parametrize("op", BINARY_OPS)
def test_binary_op_grad_matches_finite_differences_under_broadcasting(op, a_shape, b_shape):
    b = positive(*b_shape, seed=2) if op == "div" else normal(*b_shape, seed=2)
    grad_check(BINARY_OPS[op], normal(*a_shape, seed=1), b)


@pytest.mark.parametrize("op", [ag.add, ag.sub, ag.mul, ag.div])
def test_binary_function_alias_grad_matches_finite_differences(op):
    grad_check(op, normal(2, 3, seed=1), positive(2, 3, seed=2))


def test_binary_op_with_a_python_number_grad_matches_finite_differences():
    grad_check(lambda a: 2.0 * a - 1.5 / (a + 3) + a / 4, positive(2, 3))


def test_neg_grad_matches_finite_differences():
    grad_check(lambda a: -a, normal(2, 3))
    grad_check(ag.neg, normal(4))


@pytest.mark.parametrize("exponent", [2, 3, 0.5, -1, 1.5, -0.5])
def test_pow_grad_matches_finite_differences(exponent):
    needs_positive = exponent != int(exponent) or exponent < 0
    x = positive(2, 3) if needs_positive else normal(2, 3)
    grad_check(lambda a: a ** exponent, x)
    grad_check(lambda a: ag.pow(a, exponent), x)


# ---- matrix product ----

@pytest.mark.parametrize("a_shape, b_shape", [
    pytest.param((3, 4), (4, 2), id="matrix@matrix"),
    pytest.param((2, 3, 4), (2, 4, 5), id="batch@batch"),
    pytest.param((2, 1, 3, 4), (5, 4, 2), id="broadcast-leading-dims"),
    pytest.param((3, 4), (2, 4, 5), id="matrix@batch"),
    pytest.param((2, 3, 4), (4, 5), id="batch@matrix"),
    pytest.param((4,), (4, 3), id="vector@matrix"),
    pytest.param((3, 4), (4,), id="matrix@vector"),
    pytest.param((4,), (4,), id="vector@vector"),
    pytest.param((4,), (2, 4, 3), id="vector@batch"),
    pytest.param((2, 3, 4), (4,), id="batch@vector"),
])
def test_matmul_grad_matches_finite_differences(a_shape, b_shape):
    grad_check(lambda a, b: a @ b, normal(*a_shape, seed=1), normal(*b_shape, seed=2))


def test_matmul_function_alias_grad_matches_finite_differences():
    grad_check(ag.matmul, normal(3, 4, seed=1), normal(4, 2, seed=2))


# ---- reductions ----

AXES = [None, 0, 1, 2, -1, -2, (0, 2), (-1, 0), (0, 1, 2)]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES)
def test_sum_grad_matches_finite_differences(axis, keepdims):
    grad_check(lambda a: ag.sum(a, axis=axis, keepdims=keepdims), normal(2, 3, 4))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES)
def test_mean_grad_matches_finite_differences(axis, keepdims):
    grad_check(lambda a: ag.mean(a, axis=axis, keepdims=keepdims), normal(2, 3, 4))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES)
def test_max_grad_matches_finite_differences_without_ties(axis, keepdims):
    grad_check(lambda a: ag.max(a, axis=axis, keepdims=keepdims), normal(2, 3, 4))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES)
def test_logsumexp_grad_matches_finite_differences(axis, keepdims):
    grad_check(lambda a: ag.logsumexp(a, axis=axis, keepdims=keepdims), normal(2, 3, 4))


def test_reduction_methods_grad_matches_finite_differences():
    grad_check(lambda a: a.sum(axis=1) + a.mean(axis=1) + a.max(axis=1), normal(3, 4))


def test_logsumexp_grad_is_finite_for_large_inputs():
    grad_check(lambda a: ag.logsumexp(a, axis=-1), normal(3, 4) + 800.0)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_softmax_grad_matches_finite_differences(axis):
    grad_check(lambda a: ag.softmax(a, axis=axis), normal(2, 3, 4))


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_log_softmax_grad_matches_finite_differences(axis):
    grad_check(lambda a: ag.log_softmax(a, axis=axis), normal(2, 3, 4))


def test_softmax_method_uses_the_last_axis_by_default():
    grad_check(lambda a: a.softmax(), normal(3, 5))


# ---- elementwise unary ops ----

@pytest.mark.parametrize("op, make_input", [
    pytest.param(ag.exp, normal, id="exp"),
    pytest.param(ag.log, positive, id="log"),
    pytest.param(ag.sqrt, positive, id="sqrt"),
    pytest.param(ag.relu, away_from_zero, id="relu"),
    pytest.param(ag.tanh, normal, id="tanh"),
    pytest.param(ag.sigmoid, normal, id="sigmoid"),
    pytest.param(ag.gelu, normal, id="gelu"),
])
def test_unary_op_grad_matches_finite_differences(op, make_input):
    grad_check(op, make_input(3, 4))


@pytest.mark.parametrize("method", ["exp", "log", "sqrt", "relu", "tanh", "sigmoid"])
def test_unary_method_grad_matches_finite_differences(method):
    grad_check(lambda a: getattr(a, method)(), positive(2, 3))


def test_relu_grad_is_zero_for_negative_inputs_and_one_for_positive():
    x = ag.Tensor(np.array([-2.0, -0.5, 0.5, 2.0]), requires_grad=True)
    ag.sum(ag.relu(x)).backward()
    np.testing.assert_array_equal(x.grad, [0.0, 0.0, 1.0, 1.0])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.longdouble, np.int8, np.int64,
                                   np.uint8, np.complex64])
def test_relu_keeps_the_dtype_and_equals_numpys_maximum_with_0(dtype):
    x = np.array([-2, -0.0, 0, 3, np.nan] if np.dtype(dtype).kind == "f" else [-2, 0, 3]).astype(dtype)
    got = ag.relu(ag.Tensor(x)).value
    expected = np.maximum(x, 0)
    assert got.dtype == expected.dtype == x.dtype
    np.testing.assert_array_equal(got, expected)
    if x.dtype.kind in "iuf":
        np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))


def _sums_as_a_dot(x: np.ndarray, axis) -> bool:
    """The lab's short sum: a float32 or float64 vector of at most DOT_SUM_MAX (64) elements summed whole."""
    return (x.ndim == 1 and x.dtype in (np.float32, np.float64) and x.size <= ag.lab.passes.DOT_SUM_MAX
            and axis in (None, 0, (0,)))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.complex64, np.int8, np.uint8, np.bool_])
@pytest.mark.parametrize("shape", [(), (0,), (4,), (3, 5), (2, 3, 4), (1000, 37), (65,)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_sum_equals_numpys_sum_bit_for_bit_in_its_dtype_and_shape(dtype, shape, keepdims, each_path):
    """Bit for bit, but for a short float vector summed whole in the lab: that is x · 1
    (tests/test_lab.py)."""
    x = np.asarray(np.random.default_rng(0).normal(0, 50, shape)).astype(dtype)
    if x.size and x.dtype.kind == "f":
        x.flat[0] = -0.0
    for axis in [None, tuple(range(x.ndim))] + list(range(x.ndim)):
        got = ag.sum(ag.Tensor(x), axis=axis, keepdims=keepdims).value
        expected = x.sum(axis=axis, keepdims=keepdims)
        assert type(got) is np.ndarray and got.dtype == expected.dtype and got.shape == np.shape(expected)
        if each_path == "lab" and not keepdims and _sums_as_a_dot(x, axis):
            bound = x.size * np.finfo(dtype).eps * np.abs(x.astype(np.float64)).sum()  # the rounding bound
            assert abs(float(got) - float(expected)) <= bound
            continue
        np.testing.assert_array_equal(got, expected)
        if x.dtype.kind == "f":
            np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))


def test_sigmoid_grad_matches_finite_differences_far_from_zero():
    grad_check(ag.sigmoid, np.array([-30.0, -8.0, 8.0, 30.0]), rtol=1e-5, atol=1e-12)


def test_gelu_grad_matches_finite_differences_over_a_wide_range():
    grad_check(ag.gelu, np.linspace(-6.0, 6.0, 25))


# ---- shape ops ----

@pytest.mark.parametrize("shape", [(6, 4), (4, 3, 2), (-1,), (2, -1, 3), (24,)])
def test_reshape_grad_matches_finite_differences(shape):
    grad_check(lambda a: ag.reshape(a, shape), normal(2, 3, 4))


def test_reshape_method_accepts_the_shape_as_separate_arguments():
    grad_check(lambda a: a.reshape(4, 6), normal(2, 3, 4))


@pytest.mark.parametrize("axes", [None, (0, 2, 1), (2, 0, 1), (-1, 0, -2)])
def test_transpose_grad_matches_finite_differences(axes):
    grad_check(lambda a: ag.transpose(a, axes), normal(2, 3, 4))


def test_T_property_grad_matches_finite_differences():
    grad_check(lambda a: a.T, normal(3, 4))


@pytest.mark.parametrize("index", [
    pytest.param(1, id="int"),
    pytest.param(-1, id="negative-int"),
    pytest.param((1, -2), id="two-ints"),
    pytest.param(slice(1, None), id="slice"),
    pytest.param((slice(None), slice(1, 3)), id="two-slices"),
    pytest.param((slice(None, None, -1),), id="reversed"),
    pytest.param((slice(None, None, -2), slice(None), slice(4, 0, -3)), id="negative-steps"),
    pytest.param((None, 0), id="none-then-int"),
    pytest.param((slice(None), None, 2), id="none-in-the-middle"),
    pytest.param((Ellipsis, 1), id="ellipsis-then-int"),
    pytest.param((0, Ellipsis, None), id="int-ellipsis-none"),
    pytest.param(np.array([0, 2, 0, 0]), id="int-array-with-repeats"),
    pytest.param((slice(None), np.array([3, 1, 3])), id="slice-then-int-array-with-repeats"),
    pytest.param((np.array([0, 0, 1]), np.array([1, 1, -1])), id="paired-int-arrays"),
    pytest.param([1, 1, 0], id="list-with-repeats"),
])
def test_getitem_grad_matches_finite_differences(index):
    grad_check(lambda a: a[index], normal(3, 4, 5))


def test_getitem_grad_sums_repeated_entries():
    x = ag.Tensor(np.arange(4.0), requires_grad=True)
    ag.sum(x[np.array([2, 2, 2, 0])]).backward()
    np.testing.assert_array_equal(x.grad, [1.0, 0.0, 3.0, 0.0])


def test_getitem_with_a_boolean_mask_grad_matches_finite_differences():
    mask = normal(3, 4, seed=7) > 0
    grad_check(lambda a: a[mask], normal(3, 4))


def test_getitem_function_alias_grad_matches_finite_differences():
    grad_check(lambda a: ag.getitem(a, (slice(None), 0)), normal(3, 4))


@pytest.mark.parametrize("axis, shapes", [
    pytest.param(0, [(2, 3), (1, 3), (4, 3)], id="axis-0"),
    pytest.param(-1, [(2, 3), (2, 1), (2, 2)], id="axis-minus-1"),
    pytest.param(1, [(2, 3, 4), (2, 2, 4)], id="axis-1-of-3"),
])
def test_concat_grad_matches_finite_differences(axis, shapes):
    arrays = [normal(*shape, seed=i) for i, shape in enumerate(shapes)]
    grad_check(lambda *ts: ag.concat(list(ts), axis=axis), *arrays)


def test_concat_of_the_same_tensor_twice_accumulates_both_slices():
    grad_check(lambda a: ag.concat([a, a * 2.0, a], axis=0), normal(2, 3))


# ---- where ----

@pytest.mark.parametrize("cond_shape, a_shape, b_shape", [
    pytest.param((3, 4), (3, 4), (3, 4), id="same-shapes"),
    pytest.param((3, 1), (3, 4), (4,), id="broadcast-condition"),
    pytest.param((2, 3, 4), (), (3, 4), id="condition-widest"),
    pytest.param((4,), (3, 1), (2, 1, 4), id="all-broadcast"),
])
def test_where_grad_matches_finite_differences(cond_shape, a_shape, b_shape):
    condition = normal(*cond_shape, seed=9) > 0
    grad_check(lambda a, b: ag.where(condition, a, b), normal(*a_shape, seed=1),
               normal(*b_shape, seed=2))


def test_where_sends_grad_only_to_the_chosen_branch():
    condition = np.array([True, False, True])
    a = ag.Tensor(np.ones(3), requires_grad=True)
    b = ag.Tensor(np.ones(3), requires_grad=True)
    ag.sum(ag.where(condition, a, b)).backward()
    np.testing.assert_array_equal(a.grad, [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(b.grad, [0.0, 1.0, 0.0])


# ---- graphs that reuse a tensor ----

def test_tensor_added_to_itself_then_squared_gets_the_full_gradient():
    x = normal(2, 3)
    a = ag.Tensor(x, requires_grad=True)
    b = a + a
    c = b * b
    ag.sum(c).backward()
    np.testing.assert_allclose(a.grad, 8 * x)  # c = 4a², dc/da = 8a


def test_reused_tensor_grad_matches_finite_differences():
    def f(a):
        b = a + a
        return b * b
    grad_check(f, normal(2, 3))


def test_tensor_times_itself_grad_matches_finite_differences():
    grad_check(lambda x: x * x, normal(3, 4))


def test_tensor_matmul_its_own_transpose_grad_matches_finite_differences():
    grad_check(lambda x: x @ x.T, normal(3, 4))


def test_tensor_minus_itself_has_zero_grad():
    x = ag.Tensor(normal(2, 3), requires_grad=True)
    ag.sum(x - x).backward()
    np.testing.assert_array_equal(x.grad, np.zeros((2, 3)))


def test_diamond_graph_grad_matches_finite_differences():
    def f(a):
        h = ag.tanh(a)
        return ag.exp(h) * ag.sigmoid(h) + h.reshape(-1)[::-1].reshape(a.shape)
    grad_check(f, normal(2, 3))


def test_two_layer_network_grad_matches_finite_differences():
    def f(x, w1, b1, w2):
        h = ag.relu(x @ w1 + b1)
        return ag.mean(ag.log_softmax(h @ w2, axis=-1))
    grad_check(f, normal(4, 3, seed=1), normal(3, 5, seed=2), normal(5, seed=3) + 0.5,
               normal(5, 2, seed=4))


# ---- the checker itself ----

def _square_with_a_wrong_grad(a):
    value = a.value ** 2

    def _backward(out, saved):
        ag.accumulate_grad(a, out.grad * saved[a])  # deliberately wrong: d(a²)/da is 2a
    return ag.make_output(value, "square", (a,), _backward, saves=(a,))


def test_grad_check_rejects_a_wrong_gradient_and_names_the_op_input_and_element():
    expected = r"'square'.*input 0.*element \(\d+, \d+\).*analytic.*numeric"
    with pytest.raises(AssertionError, match=expected):
        grad_check(_square_with_a_wrong_grad, normal(2, 3))


def test_grad_check_rejects_a_missing_gradient():
    with pytest.raises(AssertionError, match="no gradient"):
        grad_check(lambda a, b: a * ag.Tensor(b.value), normal(2, 3, seed=1), normal(2, 3, seed=2))


def test_pow_zero_has_zero_gradient_even_at_zero():
    a = ag.Tensor(np.array([0.0, 1.0, -2.0]), requires_grad=True)
    ag.sum(a ** 0).backward()
    np.testing.assert_array_equal(a.grad, [0.0, 0.0, 0.0])


@pytest.mark.parametrize("x_shape", [(5, 3), (2, 4, 3), (3,)])
def test_linear_grad_matches_finite_differences(x_shape):
    grad_check(ag.linear, normal(*x_shape, seed=1), normal(3, 2, seed=2), normal(2, seed=3))
    grad_check(lambda x, w: ag.linear(x, w), normal(*x_shape, seed=1), normal(3, 2, seed=2))


def test_relu_backward_in_place_leaves_a_retained_output_grad_alone():
    x = ag.Tensor(np.array([-1.0, 2.0, 3.0]), requires_grad=True)
    y = ag.relu(x).retain_grad()
    ag.sum(y * np.array([5.0, 6.0, 7.0])).backward()
    np.testing.assert_array_equal(y.grad, [5.0, 6.0, 7.0])
    np.testing.assert_array_equal(x.grad, [0.0, 6.0, 7.0])
