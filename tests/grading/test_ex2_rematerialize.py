"""Exercise 2: rematerialize missing values in the backward loop; discard what can be recomputed."""
import numpy as np
import pytest

import ag
from ag import remat


def chain(seed=0):
    rng = np.random.default_rng(seed)
    weights = [ag.Tensor(rng.standard_normal((8, 8)) / 3, requires_grad=True) for _ in range(10)]
    return [lambda h, w=w: ag.tanh(h @ w) for w in weights], weights, ag.Tensor(rng.standard_normal((4, 8)))


@pytest.mark.points(3)
def test_a_tensor_with_a_rematerializer_is_discarded_and_one_without_is_kept(student):
    ex = student(2)
    kept, recomputable = ag.Tensor(np.ones(3)), ag.Tensor(np.ones(3), rematerializer=lambda: np.ones(3))
    ex.discard_value_if_has_rematerializer(kept)
    ex.discard_value_if_has_rematerializer(recomputable)
    assert kept.value is not None and recomputable.value is None


@pytest.mark.points(4)
@pytest.mark.parametrize("mode", ["segment", "tensor"])
def test_gradients_with_rematerialization_equal_those_without(student, mode):
    student(2)
    layers, weights, x = chain()
    ag.sum(remat.sequential(layers, x, list(range(10)))).backward()
    expected = [w.grad.copy() for w in weights]
    for w in weights:
        w.zero_grad()
    ag.sum(remat.sequential(layers, x, [5], mode=mode)).backward()
    for w, want in zip(weights, expected):
        np.testing.assert_array_equal(w.grad, want)


@pytest.mark.points(3)
def test_each_value_is_recomputed_from_its_checkpoint_as_often_as_the_lecture_says(student):
    student(2)
    _, weights, x = chain()
    layers = [lambda h, w=w: h @ w for w in weights]  # each layer reads only its input in backward
    with ag.count_ops() as counts:
        ag.sum(remat.sequential(layers, x, [5], mode="tensor")).backward()
    assert counts.matmuls["recompute"] == 21  # x_i costs i+1 products before 5, i-5 after
