"""Exercise 3: merging two blocks' softmax results."""
import numpy as np
import pytest
from references import logsumexp, softmax_v

from ag.attention import softmax_block
from ag.course import probe
from ag.course.checks import code, expect_close, expect_true


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


CASES = ("a's max is larger", "b's max is larger", "the maxima are equal", "a sees nothing",
         "b sees nothing", "neither sees anything", "a general row")


def merge_cases(seed, scale, cols_a=4, cols_b=6):
    """Scores of two blocks whose rows are, in order, each of CASES, and their values v."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((len(CASES), cols_a + cols_b)) * scale
    a, b = s[:, :cols_a], s[:, cols_a:]
    a[0, 0], b[1, 0] = scale * 6, scale * 6
    a[2, 0] = b[2, 0] = scale * 5
    a[3], b[4], s[5] = -np.inf, -np.inf, -np.inf
    return s, rng.standard_normal((cols_a + cols_b, 3))


def expect_merged(worker, s, v, cols_a, want_o, want_lse, cases=CASES):
    """Merge the blocks s[:, :cols_a] and s[:, cols_a:] (rows: ``cases``) and compare with the softmax
    over both, ``want_o``, and its row logsumexp ``want_lse``."""
    got = worker(merge, block(s[:, :cols_a], v[:cols_a]), block(s[:, cols_a:], v[cols_a:]))
    for row, case in enumerate(cases):
        expect_close(got["o"][row:row + 1] if type(got["o"]) is np.ndarray else got["o"], want_o[row:row + 1],
                     rtol=1e-12, atol=1e-15, what=f"o, the merged softmax(s) @ v, where {case} (row {row})")
    seen = np.isfinite(want_lse)
    expect_true(type(got["l"]) is np.ndarray and got["l"].shape == (len(cases), 1),
                f"**l**: expected an array of shape ({len(cases)}, 1), got {code(repr(got['l']))}")
    expect_close(got["l"][~seen], np.zeros((int((~seen).sum()), 1)), what="l of a row that sees nothing")
    with np.errstate(divide="ignore"):
        lse = got["m"][seen, 0] + np.log(got["l"][seen, 0])
    expect_close(lse, want_lse[seen], rtol=1e-12, what="m + log l, the merged row's logsumexp")


@pytest.mark.points(3)
def test_two_merged_blocks_equal_the_full_softmax_times_v_in_every_case(worker):
    s, v = merge_cases(0, 4.0)
    expect_merged(worker, s, v, 4, softmax_v(s, v), logsumexp(s))


@pytest.mark.points(3)
def test_online_softmax_over_many_blocks_with_huge_logits(worker):
    rng = np.random.default_rng(1)
    s, v = rng.standard_normal((3, 50)) * 1e3, rng.standard_normal((50, 2))
    got = worker(online, s, v, 7)
    expect_true(type(got["o"]) is np.ndarray and bool(np.isfinite(got["o"]).all()),
                "**o** must be finite for logits of size 1e3 (subtract the running max before exp)")
    expect_close(got["o"], softmax_v(s, v), rtol=1e-10, atol=1e-12, what="o, softmax(s) @ v over 8 blocks")
