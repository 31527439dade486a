"""Grading one submission: the judge runs in a process of its own, and the results come back
as Gradescope's results.json.

``grade`` copies the submission through the intake station (``intake``: no link followed),
then starts the judge (``python -m ag.course.judge``) on that copy, which runs the graded tests'
checks and sends their probes to sandboxed workers (see ``judge`` and ``sandbox``); it reads
the judge's results after the judge and every worker are gone. The judge shares nothing with
the shell that started it: isolated Python (``-I``: no current folder, PYTHONPATH or user
site on its path), a neutral working folder, and an environment cut to an allowlist.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .checks import fenced
from .exercises import EXERCISES, PACKAGE, REPO
from .intake import take

ISOLATION_REDUCED = ("ag grade: isolation is reduced: not running as root, so student code runs as you, "
                     "with your network and files (in a separate process whose output decides nothing)")
VISIBILITIES = ["hidden", "after_due_date", "after_published", "visible"]
MAX_OUTPUT = 12_000
# what the judge keeps of the TA's environment: the search path, the locale, ag's own settings, BLAS threads
JUDGE_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
             "MKL_NUM_THREADS")
JUDGE_ENV_PREFIXES = ("LC_", "AG_")
JUDGE_GRACE = 60.0  # seconds the judge may take past the per-student limit before it is stopped
# the judge's first lines: the ag that launched it, even where -I alone would not find it (PYTHONPATH, cwd)
BOOT = """import os, sys
from importlib.util import find_spec
parent, origin = sys.argv[1:3]
spec = find_spec("ag")
if spec is None or spec.origin is None or os.path.realpath(spec.origin) != origin:
    sys.path.insert(0, parent)
from ag.course.judge import main
sys.exit(main(sys.argv[3:]))
"""


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
    """A submission's graded tests; or, with ``error`` set, why it could not be graded (no score then)."""

    tests: list[TestResult] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what the intake did not take from the upload, and why
    error: str = ""
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds by exercise, the judge's and workers'

    @property
    def graded(self) -> bool:
        return not self.error

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)

    def by_exercise(self) -> dict[str, float]:
        """Points scored in each exercise (hidden tests included), every exercise listed, in order."""
        scores = {e.module_name: 0.0 for e in EXERCISES}
        for t in self.tests:
            if t.exercise in scores:
                scores[t.exercise] += t.score
        return scores

    def gradescope(self) -> dict:
        """Gradescope's results.json; outputs are Markdown, hidden tests wait until published; the
        intake's notes, which name the student's files, are shown as code."""
        notes = {"output": "Not graded from your upload:\n\n" + fenced("\n".join(self.notes))} if self.notes else {}
        return {
            **notes,
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
        "output": {"type": "string"},
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


def student_limit(timeout: float, student_timeout: float | None = None) -> float:
    """Seconds one submission may take in all: ``student_timeout``, by default 5 x ``timeout``, at least 120."""
    if student_timeout is not None:
        return float(student_timeout)
    return max(120.0, 5 * timeout)


def judge_env(environ=None) -> dict[str, str]:
    """The judge's environment: only the allowlisted variables of ``environ`` (tokens and keys stay out)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in JUDGE_ENV or k.startswith(JUDGE_ENV_PREFIXES)}


def grade(submission: Path | str, tests: Path | str | None = None, *, timeout: float = 60.0, slot: int = 0,
          hide=(), student_timeout: float | None = None) -> Report:
    """Grade the student folder ``submission`` with the graded tests in ``tests``.

    ``timeout``: seconds for each probe (and for loading the exercise); ``student_timeout``: seconds
    for the whole submission (``student_limit``); ``slot``: which worker user a parallel job uses;
    ``hide``: more paths the workers must not see (the results' folder, the gradebook). Raises
    RuntimeError if the judge itself fails: no grade then.
    """
    with Judge(tests, timeout=timeout, slot=slot, hide=hide, student_timeout=student_timeout) as judge:
        return judge.grade(submission)


class Judge:
    """A judge process (``python -m ag.course.judge``) that grades one submission after another.

    A class is graded with one per parallel job: the judge imports pytest, NumPy and the graded
    tests once. Each submission still gets a fresh pytest session and fresh workers. A judge that
    does not answer within the per-student limit and ``JUDGE_GRACE`` is stopped.
    """

    def __init__(self, tests: Path | str | None = None, *, timeout: float = 60.0, slot: int = 0, hide=(),
                 student_timeout: float | None = None) -> None:
        self.tests = Path(tests) if tests else REPO / "tests" / "grading"
        if not self.tests.is_dir():
            raise FileNotFoundError(f"grade: the graded tests folder {self.tests} does not exist")
        if os.geteuid() != 0:
            print(ISOLATION_REDUCED, file=sys.stderr)
        self.limit = student_limit(timeout, student_timeout)
        self.scratch = tempfile.TemporaryDirectory(prefix="ag-grade-")
        self.log = open(Path(self.scratch.name) / "judge.log", "w+")
        ini = Path(self.scratch.name) / "pytest.ini"
        ini.write_text("[pytest]\n")
        command = [sys.executable, "-I", "-B", "-c", BOOT, str(PACKAGE.parent), str(PACKAGE / "__init__.py"),
                   "--tests", str(self.tests.resolve()), "--ini", str(ini), "--timeout", str(timeout), "--student-timeout",
                   str(self.limit), "--slot", str(slot), *[a for p in hide for a in ("--hide", str(p))]]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                        text=True, cwd=self.scratch.name, env=judge_env())

    def grade(self, submission: Path | str) -> Report:
        """Grade the upload ``submission``: the judge sees only the intake's copy of it."""
        upload = Path(submission).resolve()
        if not upload.is_dir():
            raise FileNotFoundError(f"grade: the submission {upload} is not a folder")
        started = time.perf_counter()
        copy, out = Path(self.scratch.name) / "submission", Path(self.scratch.name) / "results.json"
        shutil.rmtree(copy, ignore_errors=True)
        out.unlink(missing_ok=True)
        intake = take(upload, copy)
        try:
            self.process.stdin.write(json.dumps({"submission": str(copy), "out": str(out)}) + "\n")
            self.process.stdin.flush()
            reply = json.loads(self._reply(self.limit + JUDGE_GRACE) or "{}")
        except (OSError, ValueError) as error:
            reply = {"error": f"no reply from the judge ({error})"}
        if reply.get("ok") is not True or not out.exists():
            raise RuntimeError(f"grade: {reply.get('error', 'the judge ended')}:\n{self._log_tail()}")
        results = json.loads(out.read_text())
        return Report([TestResult(**r) for r in results["tests"]], seconds=time.perf_counter() - started,
                      notes=intake.notes, cpu=results["cpu"])

    def _reply(self, seconds: float) -> str:
        """The judge's next line; a judge silent for ``seconds`` is stopped (its workers with it)."""
        ready, _, _ = select.select([self.process.stdout], [], [], seconds)
        if ready:
            return self.process.stdout.readline()
        self.stop()
        raise RuntimeError(f"grade: the judge did not answer within {seconds:g} s (the per-student limit of "
                           f"{self.limit:g} s and {JUDGE_GRACE:g} s more): it was stopped")

    def stop(self) -> None:
        """End the judge now: SIGTERM first, so that it closes its workers, then SIGKILL."""
        if self.process.poll() is None:
            self.process.stdin.close()  # no next submission: the judge exits once its workers are closed
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _log_tail(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def close(self) -> None:
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        self.log.close()
        self.scratch.cleanup()

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
