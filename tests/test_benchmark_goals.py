"""The benchmarks' goal lines: the verdict a reader sees next to a ratio is the ratio's own."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from _goals import goal, shown, verdict  # noqa: E402


@pytest.mark.parametrize("limit, resolution, digits", [(1.2, 0.0, 2), (1.0, 0.005, 3), (0.1, 0.0, 4), (1.1, 0.0, 2)])
def test_a_ratio_as_shown_gets_the_verdict_of_the_ratio_itself(limit, resolution, digits):
    """A table's goal line reads the ratio back from its text: 1.2038 shown as 1.20 read as met."""
    ratios = limit + resolution + np.random.default_rng(0).uniform(-0.01, 0.01, 2000)
    ratios = np.concatenate([ratios, [limit, limit + resolution, np.nextafter(limit + resolution, 2)]])
    for ratio in map(float, ratios):
        text = shown(ratio, limit, resolution, digits)
        assert verdict(float(text), limit, resolution) == verdict(ratio, limit, resolution), (ratio, text)
        assert len(text.split(".")[1]) >= digits and abs(float(text) - ratio) <= 0.5 * 10 ** -digits


def test_a_goal_line_just_over_its_goal_says_missed_with_the_digits_that_show_it():
    assert goal("flash / torch", 1.2038, 1.2).endswith("= 1.204 (goal <= 1.2): missed")
    assert goal("flash / torch", 1.1951, 1.2).endswith("= 1.20 (goal <= 1.2): met")


def test_a_ratio_shown_against_a_goal_and_its_stretch_goal_decides_both_as_the_ratio_does():
    """attention's flash/torch column is read back for the goal (1.2) and the stretch goal (1.0)."""
    ratios = np.concatenate([1.0 + np.random.default_rng(1).uniform(-0.01, 0.01, 2000),
                             1.2 + np.random.default_rng(2).uniform(-0.01, 0.01, 2000), [1.0, 1.2]])
    for ratio in map(float, ratios):
        text = shown(ratio, (1.2, 1.0))
        for limit in (1.2, 1.0):
            assert verdict(float(text), limit) == verdict(ratio, limit), (ratio, limit, text)
    assert shown(1.0038, (1.2, 1.0)) == "1.004" and shown(1.0038, 1.2) == "1.00"
