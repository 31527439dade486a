"""Exercise 5: the backward by recomputation from the logsumexp."""
import numpy as np
import pytest

import ag
from ag.attention import flash_attention, naive_attention


def grads(attention, arrays, **options):
    tensors = [ag.Tensor(a, requires_grad=True) for a in arrays]
    out = attention(*tensors, **options)
    ag.sum(out * np.linspace(-1, 1, out.size).reshape(out.shape)).backward()
    return [t.grad for t in tensors]


def qkv(n_q, n_k, h, h_kv, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, h, n_q, d)), rng.standard_normal((1, h_kv, n_k, d)),
            rng.standard_normal((1, h_kv, n_k, d)))


@pytest.mark.points(4)
def test_the_three_gradients_equal_naive_attention(student):
    student(5)
    arrays = qkv(33, 50, 2, 2)
    for got, want in zip(grads(flash_attention, arrays, block_q=16, block_k=8), grads(naive_attention, arrays)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


@pytest.mark.points(3)
def test_causal_grouped_query_gradients(student):
    student(5)
    arrays = qkv(30, 30, 4, 2)
    options = dict(causal=True)
    for got, want in zip(grads(flash_attention, arrays, block_q=8, block_k=8, **options),
                         grads(naive_attention, arrays, **options)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


@pytest.mark.points(3)
def test_rows_that_see_nothing_get_zero_gradients_not_nan(student):
    student(5)
    arrays = qkv(10, 4, 1, 1)
    dq, dk, dv = grads(flash_attention, arrays, causal="bottom_right", block_q=4, block_k=4)
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    np.testing.assert_array_equal(dq[..., :6, :], 0)
