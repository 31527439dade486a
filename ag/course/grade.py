"""Grading one submission: the judge runs in a process of its own, and the results come back
as Gradescope's results.json.

``grade`` starts the judge (``python -m ag.course.judge``), which runs the graded tests'
checks and sends their probes to sandboxed workers (see ``judge`` and ``sandbox``); it reads
the judge's results after the judge and every worker are gone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .exercises import EXERCISES, REPO

ISOLATION_REDUCED = ("ag grade: isolation is reduced: not running as root, so student code runs as you, "
                     "with your network and files (in a separate process whose output decides nothing)")
VISIBILITIES = ["hidden", "after_due_date", "after_published", "visible"]
MAX_OUTPUT = 12_000


@dataclass
class TestResult:
    name: str
    max_score: float
    score: float = 0.0
    status: str = "failed"
    output: str = ""
    visibility: str = "visible"
    seconds: float = 0.0

    @property
    def exercise(self) -> str:
        """The exercise's file stem the name starts with (``ex3_online_softmax``): TAs sort by it."""
        return self.name.split(":")[0]


@dataclass
class Report:
    tests: list[TestResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)

    def by_exercise(self) -> dict[str, float]:
        """Points scored per exercise (hidden tests included), in the exercises' order."""
        scores = {e.module_name: 0.0 for e in EXERCISES if any(t.exercise == e.module_name for t in self.tests)}
        for t in self.tests:
            scores[t.exercise] = scores.get(t.exercise, 0.0) + t.score
        return scores

    def gradescope(self) -> dict:
        """Gradescope's results.json; outputs are Markdown, hidden tests wait until published."""
        return {
            "score": self.score,
            "max_score": self.max_score,
            "execution_time": round(self.seconds, 2),
            "output_format": "md",
            "test_output_format": "md",
            "visibility": "visible",
            "stdout_visibility": "hidden",
            "tests": [{"name": t.name, "score": t.score, "max_score": t.max_score, "status": t.status,
                       "output": t.output, "output_format": "md", "visibility": t.visibility}
                      for t in self.tests],
        }


# What ``ag grade --json`` writes: the subset of Gradescope's results.json that ag fills in.
RESULTS_SCHEMA = {
    "type": "object",
    "required": ["score", "max_score", "execution_time", "tests"],
    "properties": {
        "score": {"type": "number", "minimum": 0},
        "max_score": {"type": "number", "minimum": 0},
        "execution_time": {"type": "number", "minimum": 0},
        "output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "test_output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "visibility": {"enum": VISIBILITIES},
        "stdout_visibility": {"enum": VISIBILITIES},
        "tests": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "score", "max_score", "status", "output", "visibility"],
                "properties": {
                    "name": {"type": "string"},
                    "score": {"type": "number", "minimum": 0},
                    "max_score": {"type": "number", "minimum": 0},
                    "status": {"enum": ["passed", "failed"]},
                    "output": {"type": "string", "maxLength": MAX_OUTPUT},
                    "output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
                    "visibility": {"enum": VISIBILITIES},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}


def grade(submission: Path | str, tests: Path | str | None = None, *, timeout: float = 60.0, slot: int = 0,
          hide=()) -> Report:
    """Grade the student folder ``submission`` with the graded tests in ``tests``.

    ``timeout``: seconds for each probe (and for loading the exercise); ``slot``: which worker
    user a parallel job uses; ``hide``: more paths the workers must not see (the results'
    folder, the gradebook). Raises RuntimeError if the judge itself fails: no grade then.
    """
    tests = Path(tests) if tests else REPO / "tests" / "grading"
    submission = Path(submission).resolve()
    if not submission.is_dir():
        raise FileNotFoundError(f"grade: the submission {submission} is not a folder")
    if not tests.is_dir():
        raise FileNotFoundError(f"grade: the graded tests folder {tests} does not exist")
    if os.geteuid() != 0:
        print(ISOLATION_REDUCED, file=sys.stderr)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ag-grade-") as scratch:
        out = Path(scratch) / "results.json"
        command = [sys.executable, "-m", "ag.course.judge", "--submission", str(submission),
                   "--tests", str(tests.resolve()), "--timeout", str(timeout), "--slot", str(slot),
                   "--out", str(out), *[a for path in hide for a in ("--hide", str(path))]]
        judge = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if judge.returncode != 0 or not out.exists():
            raise RuntimeError(f"grade: the judge failed (exit code {judge.returncode}):\n"
                               f"{judge.stdout[-3000:]}{judge.stderr[-3000:]}")
        results = json.loads(out.read_text())
    return Report([TestResult(**r) for r in results], seconds=time.perf_counter() - started)
