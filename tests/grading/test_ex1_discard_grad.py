"""Exercise 1: lazy grads and discarding them in backward."""
import numpy as np
import pytest

import ag
from ag import demo


@pytest.mark.points(2)
def test_accumulate_grad_allocates_on_first_flow_and_adds_after(student):
    ex = student(1)
    t = ag.Tensor(np.zeros(3), requires_grad=True)
    assert t.grad is None
    ex.accumulate_grad(t, np.ones(3))
    np.testing.assert_array_equal(t.grad, [1, 1, 1])
    ex.accumulate_grad(t, np.full(3, 2.0))
    np.testing.assert_array_equal(t.grad, [3, 3, 3])


@pytest.mark.points(2)
def test_backward_frees_the_grad_of_every_non_leaf_and_keeps_the_leaves(student):
    student(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4))
    w = ag.Tensor(rng.standard_normal((4, 4)), requires_grad=True)
    h1 = ag.matmul(x, w)
    h2 = ag.tanh(h1)
    loss = ag.sum(h2 * h2)
    loss.backward()
    assert h1.grad is None and h2.grad is None and loss.grad is None
    y = np.tanh(x @ w.value)
    np.testing.assert_allclose(w.grad, x.T @ (2 * y * (1 - y * y)))


@pytest.mark.points(3)
def test_backward_memory_matches_the_lecture_table(student):
    student(1)
    run = demo.matmul_chain(4096, 5, eager=False)
    assert [s.allocated_mb for s in run.backward] == [196, 171, 147, 122, 97, 40]


@pytest.mark.points(2)
def test_a_retained_grad_survives_backward(student):
    student(1)
    w = ag.Tensor(np.ones((3, 3)), requires_grad=True)
    h = ag.matmul(np.ones((2, 3)), w).retain_grad()
    ag.sum(h).backward()
    np.testing.assert_array_equal(h.grad, np.ones((2, 3)))


@pytest.mark.points(1)
def test_grads_are_correct_through_a_reused_tensor(student):
    student(1)
    a = ag.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    b = a + a
    ag.sum(b * b).backward()
    np.testing.assert_allclose(a.grad, 8 * a.value)
