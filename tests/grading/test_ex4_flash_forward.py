"""Exercise 4: the tiled forward.

Every test also runs the loop on queries that face 262,144 keys: their score matrix (1 × 2 heads
× 1024 × 262,144 float64, 4 GiB) cannot fit under the worker's 3 GiB, so attention that builds it
fails with MemoryError, while the tiles a causal query tile can see take milliseconds. No query
sees a key past the 1024th (causal), so the judge's reference needs only the first 1024."""
import functools

import numpy as np
import pytest
from references import attention, qkv

from ag.course import probe
from ag.course.checks import expect_close

LONG_QUERIES, LONG_KEYS = 1024, 262_144


def long_keys():
    """q (1, 2, 1024, 8) and k, v (1, 1, 262144, 8), two query heads sharing one key/value head; the
    keys and values no query sees are 0 (a loop that lets a query see them still gets O wrong)."""
    rng = np.random.default_rng(4)
    q, k, v = np.zeros((1, 2, LONG_QUERIES, 8)), np.zeros((1, 1, LONG_KEYS, 8)), np.zeros((1, 1, LONG_KEYS, 8))
    for x in (q, k, v):
        x[..., :LONG_QUERIES, :] = rng.standard_normal(x[..., :LONG_QUERIES, :].shape)
    return q, k, v


@probe
def flash_forward(ex, q, k, v, causal, block_q, block_k):
    """Runs in the worker: flash_attention on arrays, which runs the student's tiled_forward."""
    from ag.attention import flash_attention
    o, lse = flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k, return_lse=True)
    return {"o": o, "lse": lse}


@probe
def flash_forward_long(ex):
    """Runs in the worker: the student's tiled_forward itself, causal, on 1024 queries against 262,144
    keys in tiles of 256."""
    from ag.attention.shapes import check_shapes, softmax_scale
    from ag.attention.tiles import Tiles
    q, k, v = long_keys()
    tiles = Tiles(check_shapes("flash_attention", q, k, v), True, softmax_scale(None, q.shape[-1]), 256, 256)
    o, lse = ex.tiled_forward(tiles, q, k, v)
    return {"o": o, "lse": lse}


@functools.lru_cache(maxsize=1)
def long_reference(reference):
    """O and L of the long keys, computed once per judge."""
    q, k, v = long_keys()
    return reference(q, k[..., :LONG_QUERIES, :], v[..., :LONG_QUERIES, :], causal=True)


def expect_tiles_fit(worker, reference):
    """The loop runs where the whole score matrix cannot fit, and gives the exact causal O and L
    (``reference``: naive attention, given by the check, since a probe file's helpers reach the worker)."""
    got = worker(flash_forward_long)
    o, lse = long_reference(reference)
    expect_close(got["o"], o, rtol=0, atol=1e-10,
                 what="O, causal, of 1024 queries against 262,144 keys (their scores, 4 GiB, cannot all be held)")
    expect_close(got["lse"], lse, rtol=1e-12, what="L of 1024 queries against 262,144 keys")


@pytest.mark.points(4)
def test_the_tiled_forward_equals_naive_attention(worker):
    q, k, v = qkv(70, 45, 2, 2)
    got = worker(flash_forward, q, k, v, False, 16, 8)
    expect_close(got["o"], attention(q, k, v)[0], rtol=0, atol=1e-10, what="O, 70 queries against 45 keys")
    expect_tiles_fit(worker, attention)


@pytest.mark.points(3)
def test_causal_and_grouped_query_attention(worker):
    q, k, v = qkv(40, 40, 4, 1)
    got = worker(flash_forward, q, k, v, True, 8, 16)
    expect_close(got["o"], attention(q, k, v, causal=True)[0], rtol=0, atol=1e-10,
                 what="O, causal, 4 query heads sharing 1 key/value head")
    expect_tiles_fit(worker, attention)


@pytest.mark.points(3)
def test_the_saved_logsumexp(worker):
    q, k, v = qkv(20, 30, 1, 1)
    got = worker(flash_forward, q, k, v, False, 8, 8)
    expect_close(got["lse"], attention(q, k, v)[1], rtol=1e-12, what="L, the row logsumexp m_i + log l_i")
    expect_tiles_fit(worker, attention)
