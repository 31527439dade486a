"""Exercise 4: the tiled forward.

Every test also runs the loop on one query tile (256 rows) against 98,304 random keys, causal
aligned bottom-right, so every row sees nearly every key: one head's scores (256 × 98,304 float64)
take 192 MiB, all that this exercise's worker may map beyond its own start (``WORKER_HEADROOM``),
so attention that holds them fails with MemoryError, even over only the keys a row sees, or a
whole query tile's row at once; the tiles take a few MiB. The judge computes the reference naively,
once per judge."""
import functools

import numpy as np
import pytest
from references import attention, qkv

from ag.course import probe
from ag.course.checks import expect_close

WORKER_HEADROOM = 192 * 2**20  # bytes this exercise's worker may map past its start: one head's long scores
LONG_QUERIES = 256
LONG_KEYS = WORKER_HEADROOM // (8 * LONG_QUERIES)  # 98,304: 256 rows of their scores fill it


def long_keys():
    """q (1, 1, 256, 8) and k, v (1, 1, 98304, 8), all random: no run of keys a loop could
    recognise and fold."""
    rng = np.random.default_rng(4)
    return tuple(rng.standard_normal((1, 1, n, 8)) for n in (LONG_QUERIES, LONG_KEYS, LONG_KEYS))


@probe
def flash_forward(ex, q, k, v, causal, block_q, block_k):
    """Runs in the worker: flash_attention on arrays, which runs the student's tiled_forward."""
    from ag.attention import flash_attention
    o, lse = flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k, return_lse=True)
    return {"o": o, "lse": lse}


@probe
def flash_forward_long(ex):
    """Runs in the worker: the student's tiled_forward itself, causal bottom-right, on 256 queries
    against 98,304 keys in tiles of 256."""
    from ag.attention.shapes import check_shapes, softmax_scale
    from ag.attention.tiles import Tiles
    q, k, v = long_keys()
    tiles = Tiles(check_shapes("flash_attention", q, k, v), "bottom_right", softmax_scale(None, q.shape[-1]), 256, 256)
    o, lse = ex.tiled_forward(tiles, q, k, v)
    return {"o": o, "lse": lse}


@functools.lru_cache(maxsize=1)
def long_reference(reference):
    """O and L of the long keys, computed once per judge (the judge may hold the scores)."""
    q, k, v = long_keys()
    return reference(q, k, v, "bottom_right")


def expect_tiles_fit(worker, reference):
    """The loop runs where no head's score matrix can be held, and gives the exact O and L
    (``reference``: given by the check, since a probe file's helpers reach the worker); the long
    probe runs once per submission, however many tests check it."""
    got = worker.once(flash_forward_long)
    o, lse = long_reference(reference)
    expect_close(got["o"], o, rtol=0, atol=1e-10, what="O, causal bottom-right, of 256 queries against 98,304 "
                 "keys (one head's scores, 192 MiB, cannot be held)")
    expect_close(got["lse"], lse, rtol=1e-12, what="L of 256 queries against 98,304 keys")


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
