"""Exercise 3: merging two blocks' softmax results."""
import numpy as np
import pytest

from ag.attention import online_softmax, softmax_block


def softmax_v(s, v):
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


@pytest.mark.points(3)
def test_two_merged_blocks_equal_the_full_softmax_times_v(student):
    ex = student(3)
    rng = np.random.default_rng(0)
    s, v = rng.standard_normal((4, 10)) * 4, rng.standard_normal((10, 3))
    merged = ex.merge_softmax_blocks(softmax_block(s[:, :4], v[:4]), softmax_block(s[:, 4:], v[4:]))
    np.testing.assert_allclose(merged.o, softmax_v(s, v), rtol=1e-12)
    np.testing.assert_allclose(merged.m[:, 0], s.max(axis=1))


@pytest.mark.points(3)
def test_online_softmax_over_many_blocks_with_huge_logits(student):
    student(3)
    rng = np.random.default_rng(1)
    s, v = rng.standard_normal((3, 50)) * 1e3, rng.standard_normal((50, 2))
    o, lse = online_softmax(s, v, 7)
    assert np.isfinite(o).all()
    np.testing.assert_allclose(o, softmax_v(s, v), rtol=1e-10, atol=1e-12)
