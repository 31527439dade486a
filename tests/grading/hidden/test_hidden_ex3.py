"""A hidden test: graded like the others, shown to students only after grades are published.

`ag assign --release` leaves this folder out of what students get, and the judge never sends it
to the worker: it uses a public probe with its own data, and its check stays in the judge.
"""
import numpy as np
import pytest
from references import logsumexp, softmax_v
from test_ex3_online_softmax import expect_merged, merge_cases

SWAPPED = ("b's max is larger", "a's max is larger", "the maxima are equal", "b sees nothing", "a sees nothing",
           "neither sees anything", "a general row")  # CASES with the blocks swapped


@pytest.mark.hidden
@pytest.mark.points(2)
def test_every_merge_case_with_other_blocks_and_huge_logits(worker):
    s, v = merge_cases(5, 300.0, cols_a=7, cols_b=2)
    expect_merged(worker, s, v, 7, softmax_v(s, v), logsumexp(s))
    s, v = np.concatenate([s[:, 7:], s[:, :7]], axis=1), np.concatenate([v[7:], v[:7]])  # `return a` fails either way
    expect_merged(worker, s, v, 2, softmax_v(s, v), logsumexp(s), SWAPPED)
