"""Exercise 3: merging two blocks' softmax results."""
import numpy as np
import pytest
from references import softmax_v

from ag.attention import softmax_block
from ag.course import probe
from ag.course.checks import expect_close, expect_true


@probe
def merge(ex, a, b):
    """Runs in the worker: the student's merge of two blocks given as (o, m, l)."""
    from ag.attention import SoftmaxBlock
    merged = ex.merge_softmax_blocks(SoftmaxBlock(*a), SoftmaxBlock(*b))
    return {"o": merged.o, "m": merged.m, "l": merged.l}


@probe
def online(ex, s, v, block_size):
    """Runs in the worker: the library's online_softmax, which merges blocks with the student's code."""
    from ag.attention import online_softmax
    o, lse = online_softmax(s, v, block_size)
    return {"o": o, "lse": lse}


def block(s, v):
    b = softmax_block(s, v)
    return b.o, b.m, b.l


@pytest.mark.points(3)
def test_two_merged_blocks_equal_the_full_softmax_times_v(worker):
    rng = np.random.default_rng(0)
    s, v = rng.standard_normal((4, 10)) * 4, rng.standard_normal((10, 3))
    got = worker(merge, block(s[:, :4], v[:4]), block(s[:, 4:], v[4:]))
    expect_close(got["o"], softmax_v(s, v), rtol=1e-12, what="o, the merged softmax(s) @ v")
    expect_close(got["m"], s.max(axis=1, keepdims=True), what="m, the merged row max")


@pytest.mark.points(3)
def test_online_softmax_over_many_blocks_with_huge_logits(worker):
    rng = np.random.default_rng(1)
    s, v = rng.standard_normal((3, 50)) * 1e3, rng.standard_normal((50, 2))
    got = worker(online, s, v, 7)
    expect_true(type(got["o"]) is np.ndarray and bool(np.isfinite(got["o"]).all()),
                "**o** must be finite for logits of size 1e3 (subtract the running max before exp)")
    expect_close(got["o"], softmax_v(s, v), rtol=1e-10, atol=1e-12, what="o, softmax(s) @ v over 8 blocks")
