"""Exercise 5: the backward by recomputation from the logsumexp.

The judge hands the probe the forward's outputs (O and the logsumexp, from the reference), so
this exercise is graded on its own: a wrong exercise 4 costs nothing here. Every test also runs
the loop on one query tile (256 rows) against 98,304 random keys, causal aligned bottom-right, so
every row sees nearly every key: one head's P (256 × 98,304 float64) takes 192 MiB, all that this
exercise's worker may map beyond its own start (``WORKER_HEADROOM``), so a backward that holds it
fails with MemoryError, even over only the keys a row sees; one that recomputes P tile by tile
fits. The judge computes the reference naively, once per judge."""
import functools

import numpy as np
import pytest
from references import attention, attention_grads, qkv

from ag.course import probe
from ag.course.checks import expect_close

WORKER_HEADROOM = 192 * 2**20  # bytes this exercise's worker may map past its start: one head's long P
LONG_QUERIES = 256
LONG_KEYS = WORKER_HEADROOM // (8 * LONG_QUERIES)  # 98,304: 256 rows of their P fill it


def long_keys():
    """q and dO (1, 1, 256, 8), k and v (1, 1, 98304, 8), all random: no run of keys a loop could
    recognise and fold."""
    rng = np.random.default_rng(5)
    return tuple(rng.standard_normal((1, 1, n, 8)) for n in (LONG_QUERIES, LONG_KEYS, LONG_KEYS, LONG_QUERIES))


@probe
def flash_backward(ex, q, k, v, o, lse, do, causal, block_q, block_k):
    """Runs in the worker: the student's tiled_backward over the tiles flash_attention would use."""
    from ag.attention.shapes import check_shapes, softmax_scale
    from ag.attention.tiles import Tiles
    tiles = Tiles(check_shapes("flash_attention", q, k, v), causal, softmax_scale(None, q.shape[-1]), block_q, block_k)
    dq, dk, dv = ex.tiled_backward(tiles, q, k, v, o, lse, do)
    return {"dq": dq, "dk": dk, "dv": dv}


@probe
def flash_backward_long(ex, o, lse):
    """Runs in the worker: the student's loop, causal bottom-right, on 256 queries against 98,304 keys."""
    q, k, v, do = long_keys()
    return flash_backward(ex, q, k, v, o, lse, do, "bottom_right", 256, 256)


def check_grads(worker, arrays, causal, block_q, block_k, reference, reference_grads):
    """dQ, dK, dV of the arrays against the references (given by the check: a probe file's helpers
    reach the worker, its checks do not)."""
    q, k, v = arrays
    o, lse = reference(q, k, v, causal)
    do = np.linspace(-1, 1, o.size).reshape(o.shape)
    got = worker(flash_backward, q, k, v, o, lse, do, causal, block_q, block_k)
    for name, want in zip(("dq", "dk", "dv"), reference_grads(q, k, v, do, causal)):
        expect_close(got[name], want, rtol=0, atol=1e-10, what=f"{name[1:].upper()}'s gradient d{name[1:].upper()}")
    return got


@functools.lru_cache(maxsize=1)
def long_reference(reference, reference_grads):
    """O, L and the gradients of the long keys, computed once per judge (the judge may hold P)."""
    q, k, v, do = long_keys()
    return reference(q, k, v, "bottom_right"), reference_grads(q, k, v, do, "bottom_right")


def expect_recomputed_tiles_fit(worker, reference, reference_grads):
    """The loop runs where no head's P can be held whole, and gives the exact gradients; the long
    probe runs once per submission, however many tests check it."""
    (o, lse), grads = long_reference(reference, reference_grads)
    got = worker.once(flash_backward_long, o, lse)
    where = "of 256 queries against 98,304 keys, causal bottom-right (one head's P, 192 MiB, cannot be held)"
    for name, want in zip(("dq", "dk", "dv"), grads):
        expect_close(got[name], want, rtol=0, atol=1e-10, what=f"d{name[1:].upper()}, {where}")


@pytest.mark.points(4)
def test_the_three_gradients_equal_naive_attention(worker):
    check_grads(worker, qkv(33, 50, 2, 2), False, 16, 8, attention, attention_grads)
    expect_recomputed_tiles_fit(worker, attention, attention_grads)


@pytest.mark.points(3)
def test_causal_grouped_query_gradients(worker):
    check_grads(worker, qkv(30, 30, 4, 2), True, 8, 8, attention, attention_grads)
    expect_recomputed_tiles_fit(worker, attention, attention_grads)


@pytest.mark.points(3)
def test_rows_that_see_nothing_get_zero_gradients_not_nan(worker):
    got = check_grads(worker, qkv(10, 4, 1, 1), "bottom_right", 4, 4, attention, attention_grads)
    expect_recomputed_tiles_fit(worker, attention, attention_grads)
    expect_close(got["dq"][..., :6, :], np.zeros((1, 1, 6, 8)), what="dQ of the 6 rows that see no key")
