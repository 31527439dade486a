"""Exercise 5: the backward by recomputation from the logsumexp.

The judge hands the probe the forward's outputs (O and the logsumexp, from the reference), so
this exercise is graded on its own: a wrong exercise 4 costs nothing here."""
import numpy as np
import pytest
from references import attention, attention_grads, qkv

from ag.course import probe
from ag.course.checks import expect_close


@probe
def flash_backward(ex, q, k, v, o, lse, do, causal, block_q, block_k):
    """Runs in the worker: the student's tiled_backward over the tiles flash_attention would use."""
    from ag.attention.shapes import check_shapes, softmax_scale
    from ag.attention.tiles import Tiles
    tiles = Tiles(check_shapes("flash_attention", q, k, v), causal, softmax_scale(None, q.shape[-1]), block_q, block_k)
    dq, dk, dv = ex.tiled_backward(tiles, q, k, v, o, lse, do)
    return {"dq": dq, "dk": dk, "dv": dv}


def check_grads(worker, arrays, causal, block_q, block_k):
    q, k, v = arrays
    o, lse = attention(q, k, v, causal)
    do = np.linspace(-1, 1, o.size).reshape(o.shape)
    got = worker(flash_backward, q, k, v, o, lse, do, causal, block_q, block_k)
    for name, want in zip(("dq", "dk", "dv"), attention_grads(q, k, v, do, causal)):
        expect_close(got[name], want, rtol=0, atol=1e-10, what=f"{name[1:].upper()}'s gradient d{name[1:].upper()}")
    return got


@pytest.mark.points(4)
def test_the_three_gradients_equal_naive_attention(worker):
    check_grads(worker, qkv(33, 50, 2, 2), False, 16, 8)


@pytest.mark.points(3)
def test_causal_grouped_query_gradients(worker):
    check_grads(worker, qkv(30, 30, 4, 2), True, 8, 8)


@pytest.mark.points(3)
def test_rows_that_see_nothing_get_zero_gradients_not_nan(worker):
    got = check_grads(worker, qkv(10, 4, 1, 1), "bottom_right", 4, 4)
    expect_close(got["dq"][..., :6, :], np.zeros((1, 1, 6, 8)), what="dQ of the 6 rows that see no key")
