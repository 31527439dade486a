"""Exercise 4: the tiled forward.

Every test also runs the loop on one query tile (256 rows) against 393,216 keys, causal aligned
bottom-right, so every row sees nearly every key: one head's scores (256 × 393,216 float64) take
768 MiB, all that this exercise's worker may map (``WORKER_ADDRESS_SPACE``), so attention that
holds them fails with MemoryError, even over only the keys a row sees, or a whole query tile's
row at once; the tiles take a few MiB. The keys and values between the first 1,024 and the
diagonal tile are 0, so the judge's reference folds them into one key (``attention_over_zero_keys``)."""
import functools

import numpy as np
import pytest
from references import attention, attention_over_zero_keys, qkv

from ag.course import probe
from ag.course.checks import expect_close

WORKER_ADDRESS_SPACE = 768 * 2**20  # bytes this exercise's worker may map: one head's long scores
LONG_QUERIES, LONG_HEAD = 256, 1024
LONG_KEYS = WORKER_ADDRESS_SPACE // (8 * LONG_QUERIES)  # 393,216: 256 rows of their scores fill it


def long_keys():
    """q (1, 1, 256, 8) and k, v (1, 1, 393216, 8): the first 1024 keys and the last 256 (the
    diagonal tile) random, the ones between 0 with their values (a loop that skips them gets L wrong)."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 1, LONG_QUERIES, 8))
    k, v = np.zeros((1, 1, LONG_KEYS, 8)), np.zeros((1, 1, LONG_KEYS, 8))
    for x in (k, v):
        x[..., :LONG_HEAD, :] = rng.standard_normal((1, 1, LONG_HEAD, 8))
        x[..., LONG_KEYS - LONG_QUERIES:, :] = rng.standard_normal((1, 1, LONG_QUERIES, 8))
    return q, k, v


@probe
def flash_forward(ex, q, k, v, causal, block_q, block_k):
    """Runs in the worker: flash_attention on arrays, which runs the student's tiled_forward."""
    from ag.attention import flash_attention
    o, lse = flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k, return_lse=True)
    return {"o": o, "lse": lse}


@probe
def flash_forward_long(ex):
    """Runs in the worker: the student's tiled_forward itself, causal bottom-right, on 256 queries
    against 393,216 keys in tiles of 256."""
    from ag.attention.shapes import check_shapes, softmax_scale
    from ag.attention.tiles import Tiles
    q, k, v = long_keys()
    tiles = Tiles(check_shapes("flash_attention", q, k, v), "bottom_right", softmax_scale(None, q.shape[-1]), 256, 256)
    o, lse = ex.tiled_forward(tiles, q, k, v)
    return {"o": o, "lse": lse}


@functools.lru_cache(maxsize=1)
def long_reference(reference):
    """O and L of the long keys, computed once per judge (``reference``: the zero keys folded)."""
    q, k, v = long_keys()
    return reference(q, k, v, LONG_HEAD)


def expect_tiles_fit(worker, reference):
    """The loop runs where no head's score matrix can be held, and gives the exact O and L
    (``reference``: given by the check, since a probe file's helpers reach the worker); the long
    probe runs once per submission, however many tests check it."""
    got = worker.once(flash_forward_long)
    o, lse = long_reference(reference)
    expect_close(got["o"], o, rtol=0, atol=1e-10, what="O, causal bottom-right, of 256 queries against 393,216 "
                 "keys (one head's scores, 768 MiB, cannot be held)")
    expect_close(got["lse"], lse, rtol=1e-12, what="L of 256 queries against 393,216 keys")


@pytest.mark.points(4)
def test_the_tiled_forward_equals_naive_attention(worker):
    q, k, v = qkv(70, 45, 2, 2)
    got = worker(flash_forward, q, k, v, False, 16, 8)
    expect_close(got["o"], attention(q, k, v)[0], rtol=0, atol=1e-10, what="O, 70 queries against 45 keys")
    expect_tiles_fit(worker, attention_over_zero_keys)


@pytest.mark.points(3)
def test_causal_and_grouped_query_attention(worker):
    q, k, v = qkv(40, 40, 4, 1)
    got = worker(flash_forward, q, k, v, True, 8, 16)
    expect_close(got["o"], attention(q, k, v, causal=True)[0], rtol=0, atol=1e-10,
                 what="O, causal, 4 query heads sharing 1 key/value head")
    expect_tiles_fit(worker, attention_over_zero_keys)


@pytest.mark.points(3)
def test_the_saved_logsumexp(worker):
    q, k, v = qkv(20, 30, 1, 1)
    got = worker(flash_forward, q, k, v, False, 8, 8)
    expect_close(got["lse"], attention(q, k, v)[1], rtol=1e-12, what="L, the row logsumexp m_i + log l_i")
    expect_tiles_fit(worker, attention_over_zero_keys)
