"""Exercise 4: the tiled forward."""
import numpy as np
import pytest
from references import attention, qkv

from ag.course import probe
from ag.course.checks import expect_close


@probe
def flash_forward(ex, q, k, v, causal, block_q, block_k):
    """Runs in the worker: flash_attention on arrays with the running max, which runs the student's
    tiled_forward (the default fixed shift runs ag's own loop, ``fixed_shift_forward``)."""
    from ag.attention import flash_attention
    o, lse = flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k, return_lse=True,
                             shift="running")
    return {"o": o, "lse": lse}


@pytest.mark.points(4)
def test_the_tiled_forward_equals_naive_attention(worker):
    q, k, v = qkv(70, 45, 2, 2)
    got = worker(flash_forward, q, k, v, False, 16, 8)
    expect_close(got["o"], attention(q, k, v)[0], rtol=0, atol=1e-10, what="O, 70 queries against 45 keys")


@pytest.mark.points(3)
def test_causal_and_grouped_query_attention(worker):
    q, k, v = qkv(40, 40, 4, 1)
    got = worker(flash_forward, q, k, v, True, 8, 16)
    expect_close(got["o"], attention(q, k, v, causal=True)[0], rtol=0, atol=1e-10,
                 what="O, causal, 4 query heads sharing 1 key/value head")


@pytest.mark.points(3)
def test_the_saved_logsumexp(worker):
    q, k, v = qkv(20, 30, 1, 1)
    got = worker(flash_forward, q, k, v, False, 8, 8)
    expect_close(got["lse"], attention(q, k, v)[1], rtol=1e-12, what="L, the row logsumexp m_i + log l_i")
