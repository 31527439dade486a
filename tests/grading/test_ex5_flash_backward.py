"""Exercise 5: the backward by recomputation from the logsumexp.

The judge hands the probe the forward's outputs (O and the logsumexp, from the reference), so
this exercise is graded on its own: a wrong exercise 4 costs nothing here. Every test also runs
the loop on queries that face 262,144 keys, where the probabilities P (1 × 2 heads × 1024 ×
262,144 float64, 4 GiB) cannot fit under the worker's 3 GiB: a backward that builds them fails
with MemoryError, one that recomputes P tile by tile takes milliseconds."""
import functools

import numpy as np
import pytest
from references import attention, attention_grads, qkv

from ag.course import probe
from ag.course.checks import expect_close, expect_true

LONG_QUERIES, LONG_KEYS = 1024, 262_144


def long_keys():
    """q and dO (1, 2, 1024, 8), k and v (1, 1, 262144, 8), two query heads sharing one key/value head;
    the keys and values no query sees are 0."""
    rng = np.random.default_rng(5)
    q, k, v = np.zeros((1, 2, LONG_QUERIES, 8)), np.zeros((1, 1, LONG_KEYS, 8)), np.zeros((1, 1, LONG_KEYS, 8))
    for x in (q, k, v):
        x[..., :LONG_QUERIES, :] = rng.standard_normal(x[..., :LONG_QUERIES, :].shape)
    return q, k, v, rng.standard_normal(q.shape)


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
    """Runs in the worker: the student's loop, causal, on 1024 queries against 262,144 keys; dK and dV
    of the first 1024 keys, and the largest |dK|, |dV| of the rest (no query sees them)."""
    q, k, v, do = long_keys()
    got = flash_backward(ex, q, k, v, o, lse, do, True, 256, 256)
    rest = [np.abs(got[name][..., LONG_QUERIES:, :]).max() if type(got[name]) is np.ndarray else got[name]
            for name in ("dk", "dv")]
    return {"dq": got["dq"], "dk": got["dk"][..., :LONG_QUERIES, :], "dv": got["dv"][..., :LONG_QUERIES, :],
            "rest": rest}


def check_grads(worker, arrays, causal, block_q, block_k, reference, reference_grads):
    """dQ, dK, dV of the arrays against the references (given by the check: a probe file's helpers
    reach the worker, its checks do not), then the same loop on the long keys."""
    q, k, v = arrays
    o, lse = reference(q, k, v, causal)
    do = np.linspace(-1, 1, o.size).reshape(o.shape)
    got = worker(flash_backward, q, k, v, o, lse, do, causal, block_q, block_k)
    for name, want in zip(("dq", "dk", "dv"), reference_grads(q, k, v, do, causal)):
        expect_close(got[name], want, rtol=0, atol=1e-10, what=f"{name[1:].upper()}'s gradient d{name[1:].upper()}")
    expect_recomputed_tiles_fit(worker, reference, reference_grads)
    return got


@functools.lru_cache(maxsize=1)
def long_reference(reference, reference_grads):
    """O, L and the gradients of the long keys, computed once per judge: no query sees a key past
    the 1024th (causal), so the references need only the first 1024."""
    q, k, v, do = long_keys()
    seen = (k[..., :LONG_QUERIES, :], v[..., :LONG_QUERIES, :])
    return reference(q, *seen, causal=True), reference_grads(q, *seen, do, causal=True)


def expect_recomputed_tiles_fit(worker, reference, reference_grads):
    """The loop runs where P cannot be held whole, and gives the exact causal gradients."""
    (o, lse), grads = long_reference(reference, reference_grads)
    got = worker(flash_backward_long, o, lse)
    where = "of 1024 queries against 262,144 keys (their P, 4 GiB, cannot be held whole)"
    for name, want in zip(("dq", "dk", "dv"), grads):
        expect_close(got[name], want, rtol=0, atol=1e-10, what=f"d{name[1:].upper()}, causal, {where}")
    expect_true(got["rest"] == [0.0, 0.0], f"**dK and dV of the keys no query sees** must be 0; their largest "
                                           f"magnitudes are {got['rest']}")


@pytest.mark.points(4)
def test_the_three_gradients_equal_naive_attention(worker):
    check_grads(worker, qkv(33, 50, 2, 2), False, 16, 8, attention, attention_grads)


@pytest.mark.points(3)
def test_causal_grouped_query_gradients(worker):
    check_grads(worker, qkv(30, 30, 4, 2), True, 8, 8, attention, attention_grads)


@pytest.mark.points(3)
def test_rows_that_see_nothing_get_zero_gradients_not_nan(worker):
    got = check_grads(worker, qkv(10, 4, 1, 1), "bottom_right", 4, 4, attention, attention_grads)
    expect_close(got["dq"][..., :6, :], np.zeros((1, 1, 6, 8)), what="dQ of the 6 rows that see no key")
