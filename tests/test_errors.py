"""Bad input raises an error that names the op, the shapes or values, and what was expected."""
import numpy as np
import pytest

import ag


def t(*shape):
    return ag.Tensor(np.ones(shape), requires_grad=True)


def test_matmul_with_mismatched_inner_dimensions():
    with pytest.raises(ag.ShapeError, match=r"matmul: shapes \(3, 4\) and \(5, 2\) do not align"):
        ag.matmul(t(3, 4), t(5, 2))


def test_matmul_with_batch_dimensions_that_do_not_broadcast():
    with pytest.raises(ag.ShapeError, match=r"matmul's batch dimensions: shapes \(2,\) and \(3,\) do not broadcast"):
        t(2, 3, 4) @ t(3, 4, 5)


def test_matmul_with_a_scalar():
    with pytest.raises(ag.ShapeError, match="matmul: .*at least 1 dimension"):
        ag.matmul(t(), t(3))


@pytest.mark.parametrize("op", [ag.add, ag.sub, ag.mul, ag.div])
def test_binary_ops_refuse_shapes_that_do_not_broadcast(op):
    with pytest.raises(ag.ShapeError, match=rf"{op.__name__}: shapes \(3, 2\) and \(4,\) do not broadcast"):
        op(t(3, 2), t(4))


def test_non_numeric_values_are_refused_by_the_constructor():
    with pytest.raises(TypeError, match="numeric.*<U"):
        ag.Tensor(["a", "b"])
    with pytest.raises(TypeError, match="numeric.*object"):
        ag.Tensor({"a": 1})


def test_non_numeric_operands_are_refused_by_the_op():
    with pytest.raises(TypeError, match="mul: .*str"):
        ag.mul(t(2), "x")


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(TypeError, match="floating-point.*int64"):
        ag.Tensor(np.arange(3), requires_grad=True)


def test_backward_on_a_non_scalar_names_the_shape():
    with pytest.raises(ag.GraphError, match=r"shape \(2, 3\).*scalar"):
        (t(2, 3) * 2).backward()


def test_backward_after_the_graph_was_discarded():
    loss = ag.sum(ag.exp(t(3)))
    loss.backward()
    with pytest.raises(ag.GraphError, match="retain_graph=True"):
        loss.backward()


def test_using_a_discarded_value_in_forward_names_the_op():
    h = ag.exp(t(3))
    h.value = None
    with pytest.raises(ag.GraphError, match="mul needs the value of output of exp, which was discarded"):
        h * 2


@pytest.mark.parametrize("op", [ag.sum, ag.mean, ag.max, ag.logsumexp])
def test_reductions_refuse_an_axis_out_of_range(op):
    with pytest.raises(ag.ShapeError, match=rf"{op.__name__}: axis 2 is out of range .* 2 dimensions"):
        op(t(2, 3), axis=2)


@pytest.mark.parametrize("op", [ag.softmax, ag.log_softmax])
def test_softmax_refuses_an_axis_out_of_range(op):
    with pytest.raises(ag.ShapeError, match=rf"{op.__name__}: axis -3 is out of range"):
        op(t(2, 3), axis=-3)


def test_reductions_refuse_a_repeated_axis():
    with pytest.raises(ag.ShapeError, match="sum: repeated axis"):
        ag.sum(t(2, 3), axis=(1, -1))


def test_reshape_to_a_different_size():
    with pytest.raises(ag.ShapeError, match=r"reshape: .*shape \(2, 3\) \(6 elements\) to \(4,\)"):
        ag.reshape(t(2, 3), (4,))


def test_transpose_with_axes_that_are_not_a_permutation():
    with pytest.raises(ag.ShapeError, match=r"transpose: .*\(0, 0\)"):
        ag.transpose(t(2, 3), (0, 0))
    with pytest.raises(ag.ShapeError, match=r"transpose: axes \(0,\)"):
        ag.transpose(t(2, 3), (0,))


def test_getitem_out_of_bounds():
    with pytest.raises(ag.ShapeError, match=r"getitem: index 5 does not fit shape \(3,\)"):
        t(3)[5]


def test_concat_of_shapes_that_differ_off_the_axis():
    with pytest.raises(ag.ShapeError, match=r"concat: shapes \[\(2, 3\), \(2, 4\)\] differ outside axis 0"):
        ag.concat([t(2, 3), t(2, 4)], axis=0)


def test_where_needs_a_boolean_condition():
    with pytest.raises(TypeError, match="where: condition must be a boolean array, got float64"):
        ag.where(np.ones(3), t(3), t(3))


def test_pow_needs_a_number_exponent():
    with pytest.raises(TypeError, match="pow: the exponent must be a number"):
        ag.pow(t(3), t(3))


def test_a_tensor_cannot_wrap_a_tensor():
    with pytest.raises(TypeError, match="already a Tensor"):
        ag.Tensor(t(2))


def test_linear_with_a_bias_of_the_wrong_size():
    with pytest.raises(ag.ShapeError, match=r"linear: bias of shape \(3,\) does not match weight \(4, 2\)"):
        ag.linear(t(5, 4), t(4, 2), t(3))
