"""Graded tests: each runs against a student's folder (AG_SUBMISSION) or, by default, solutions/."""
import os
from pathlib import Path

import pytest

from ag import course

SUBMISSION = Path(os.environ.get("AG_SUBMISSION") or Path(__file__).resolve().parents[2] / "solutions")


@pytest.fixture
def student(monkeypatch):
    """``student(n)`` imports exercise n from the submission and puts its functions into ag."""
    def load(number: int):
        exercise = next(e for e in course.EXERCISES if e.number == number)
        module = course.load_submission(SUBMISSION, exercise)
        course.install(module, setter=monkeypatch.setattr)
        return module
    return load
