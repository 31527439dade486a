"""Exercise 4: the tiled forward."""
import numpy as np
import pytest

from ag.attention import flash_attention, naive_attention


def qkv(n_q, n_k, h, h_kv, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, h, n_q, d)), rng.standard_normal((1, h_kv, n_k, d)),
            rng.standard_normal((1, h_kv, n_k, d)))


@pytest.mark.points(4)
def test_the_tiled_forward_equals_naive_attention(student):
    student(4)
    q, k, v = qkv(70, 45, 2, 2)
    np.testing.assert_allclose(flash_attention(q, k, v, block_q=16, block_k=8), naive_attention(q, k, v),
                               rtol=0, atol=1e-10)


@pytest.mark.points(3)
def test_causal_and_grouped_query_attention(student):
    student(4)
    q, k, v = qkv(40, 40, 4, 1)
    np.testing.assert_allclose(flash_attention(q, k, v, causal=True, block_q=8, block_k=16),
                               naive_attention(q, k, v, causal=True), rtol=0, atol=1e-10)


@pytest.mark.points(3)
def test_the_saved_logsumexp(student):
    student(4)
    q, k, v = qkv(20, 30, 1, 1)
    _, lse = flash_attention(q, k, v, block_q=8, block_k=8, return_lse=True)
    s = q[0, 0] @ k[0, 0].T / np.sqrt(8)
    np.testing.assert_allclose(lse[0, 0], np.log(np.exp(s).sum(axis=1)), rtol=1e-12)
