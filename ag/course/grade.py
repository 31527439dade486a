"""GRADING (to be rewritten)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .exercises import REPO

@dataclass
class TestResult:
    name: str
    max_score: float
    score: float = 0.0
    status: str = "failed"
    output: str = ""
    visibility: str = "visible"
    seconds: float = 0.0


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

    def gradescope(self) -> dict:
        """Gradescope's results.json: score, max_score, execution_time, tests[...]."""
        return {
            "score": self.score,
            "max_score": self.max_score,
            "execution_time": round(self.seconds, 2),
            "visibility": "visible",
            "stdout_visibility": "hidden",
            "tests": [{"name": t.name, "score": t.score, "max_score": t.max_score, "status": t.status,
                       "output": t.output, "visibility": t.visibility} for t in self.tests],
        }


MAX_OUTPUT = 10_000

# What ``ag grade --json`` writes: the subset of Gradescope's results.json that ag fills in.
RESULTS_SCHEMA = {
    "type": "object",
    "required": ["score", "max_score", "execution_time", "tests"],
    "properties": {
        "score": {"type": "number", "minimum": 0},
        "max_score": {"type": "number", "minimum": 0},
        "execution_time": {"type": "number", "minimum": 0},
        "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "stdout_visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
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
                    "output": {"type": "string", "maxLength": 12_000},
                    "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}


def collect(tests: Path) -> list[dict]:
    """The graded tests under ``tests`` with their points and visibility, via pytest."""
    with _temp_json() as out:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", str(tests), "--collect-only", "-q", "-p", "ag.course.plugin",
             "-p", "no:cacheprovider"], capture_output=True, text=True,
            env={**os.environ, "AG_GRADING_COLLECT": str(out)}, timeout=300)
        if proc.returncode not in (0, 5) or not out.exists():
            raise RuntimeError(f"grade: could not collect the tests in {tests}:\n{proc.stdout[-3000:]}"
                               f"{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def grade(submission: Path | str, tests: Path | str | None = None, *, timeout: float = 60.0) -> Report:
    """Run every graded test on the student folder ``submission``, each in its own process."""
    tests = Path(tests) if tests else REPO / "tests" / "grading"
    submission = Path(submission).resolve()
    started = time.perf_counter()
    report = Report()
    for item in collect(tests):
        result = TestResult(item["name"], float(item["points"]), visibility=item["visibility"])
        t0 = time.perf_counter()
        result.status, result.output = _run_one(item["nodeid"], submission, tests, timeout)
        result.seconds = time.perf_counter() - t0
        result.score = result.max_score if result.status == "passed" else 0.0
        report.tests.append(result)
    report.seconds = time.perf_counter() - started
    return report


def _run_one(nodeid: str, submission: Path, tests: Path, timeout: float) -> tuple[str, str]:
    cmd = [sys.executable, "-m", "pytest", nodeid, "-q", "-x", "--no-header", "-p", "no:cacheprovider",
           "-p", "ag.course.plugin", "--tb=short"]
    env = {**os.environ, "AG_SUBMISSION": str(submission), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, env=env, timeout=timeout, cwd=tests.parent.parent)
    except subprocess.TimeoutExpired as expired:
        return "failed", f"timed out after {timeout:g} s\n" + _clip((expired.stdout or b"").decode(errors="replace"))
    text = _clip(proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace"))
    if proc.returncode == 0:
        return "passed", ""
    return "failed", text or f"the test process ended with exit code {proc.returncode}"


def _clip(text: str) -> str:
    if len(text) <= MAX_OUTPUT:
        return text
    return text[:MAX_OUTPUT // 2] + f"\n... [{len(text) - MAX_OUTPUT:,} characters cut] ...\n" + text[-MAX_OUTPUT // 2:]


class _temp_json:
    def __enter__(self) -> Path:
        import tempfile
        self.dir = tempfile.TemporaryDirectory()
        return Path(self.dir.name) / "collected.json"

    def __exit__(self, *exc) -> None:
        self.dir.cleanup()


