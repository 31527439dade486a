"""A hidden test: graded like the others, shown to students only after grades are published.

Keep hidden tests out of the repository students clone (a private fork, or delete this folder
from the handout); ``ag grade --autograder`` bundles them with the rest.
"""
import numpy as np
import pytest

from ag.attention import SoftmaxBlock


@pytest.mark.hidden
@pytest.mark.points(2)
def test_merging_with_an_empty_block_changes_nothing(student):
    ex = student(3)
    rng = np.random.default_rng(2)
    block = SoftmaxBlock(rng.standard_normal((3, 2)), rng.standard_normal((3, 1)), np.ones((3, 1)))
    empty = SoftmaxBlock(np.zeros((3, 2)), np.zeros((3, 1)), np.zeros((3, 1)))
    merged = ex.merge_softmax_blocks(block, empty)
    np.testing.assert_allclose(merged.o, block.o)
    np.testing.assert_allclose(merged.l * np.exp(merged.m), block.l * np.exp(block.m))
