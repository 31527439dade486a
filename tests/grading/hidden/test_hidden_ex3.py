"""A hidden test: graded like the others, shown to students only after grades are published.

`ag assign --release` leaves this folder out of what students get, and the judge never sends it
to the worker: it uses a public probe with its own data, and its check stays in the judge.
"""
import numpy as np
import pytest
from test_ex3_online_softmax import merge

from ag.course.checks import expect_close


@pytest.mark.hidden
@pytest.mark.points(2)
def test_merging_with_an_empty_block_changes_nothing(worker):
    rng = np.random.default_rng(2)
    o, m, l = rng.standard_normal((3, 2)), rng.standard_normal((3, 1)), np.ones((3, 1))
    got = worker(merge, (o, m, l), (np.zeros((3, 2)), np.zeros((3, 1)), np.zeros((3, 1))))
    expect_close(got["o"], o, what="o merged with an empty block")
    expect_close(got["l"] * np.exp(got["m"]), l * np.exp(m), what="l · exp(m), the unnormalized total")
