"""The judge: runs the graded tests' checks in its own process, on data from sandboxed workers.

A graded test is a probe and a check. The probe (a function marked ``@probe`` in a public test
file) runs in the worker on the student's module and data the judge sends; the check is the
``test_*`` function, which runs here, asks the ``worker`` fixture for the probe's data and
asserts on it against references computed here. Student code never runs in this process, so
nothing it patches, prints or exits with reaches a verdict.

It is a pytest plugin (``python -m ag.course.judge`` runs pytest with it): pytest collects the
tests, their ``points(n)`` and ``hidden`` markers, and the parametrizations; the plugin starts one
worker per exercise at a time, restarts it after a crash or a time-out (the test it was running
fails, the next starts afresh), and records each test's result. A test file may bound what its
exercise's worker maps beyond its own start (``WORKER_HEADROOM``, bytes), so that a probe size is
decisive on any machine; a probe several tests share runs once (``worker.once``). The results are
written only after every worker process is gone, with the CPU seconds each exercise took. A
submission has a wall-clock budget on top of the per-test timeout: once it is spent, the test
running fails and the ones after it fail at once, each saying so.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from . import channel, payload
from .checks import fenced
from .exercises import exercise_of
from .sandbox import ADDRESS_SPACE, SandboxError, StudentError, Worker, kill_all
from .worker import clip

MAX_TEST_OUTPUT = 4000


class StudentLimit(Exception):
    """The submission's wall-clock budget (``ag grade --student-timeout``) is spent."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"stopped: the per-student limit of {seconds:g} s was reached (ag grade "
                         "--student-timeout): this test and the ones after it are not run to the end")


class Session:
    """What one grading session (one submission) knows: the submission, the tests' metadata, the worker in use."""

    def __init__(self, submission: Path, tests: Path, timeout: float, slot: int, hide: list[str],
                 student_timeout: float | None = None) -> None:
        self.submission, self.tests, self.timeout, self.slot, self.hide = submission, tests, timeout, slot, hide
        self.student_timeout = student_timeout
        self.deadline = time.monotonic() + student_timeout if student_timeout else math.inf
        self.meta: dict[str, dict] = {}
        self.order: list[str] = []
        self.results: dict[str, dict] = {}
        self.probes_per_exercise: dict[int, int] = {}
        self.headroom: dict[int, int] = {}  # the exercises whose test files bound their worker's memory
        self.once: dict[str, tuple[bool, object]] = {}  # worker.once's data (or failure) by probe and arguments
        self.worker: Worker | None = None
        self.worker_exercise = None
        self.secrets = payload.secrets(tests, submission, hide)
        self.broken: dict[int, str] = {}  # exercises whose file cannot even be imported
        self.cpu: dict[str, float] = {}  # CPU seconds by exercise: the judge's, and its workers' once reaped
        self.cpu_mark = cpu_seconds()

    def collect(self, items) -> None:
        """Read each test's points, visibility and exercise; run them exercise by exercise, the
        hidden ones last within theirs, so each exercise needs one worker."""
        for item in items:
            points = item.get_closest_marker("points")
            if points is None or not points.args:
                raise pytest.UsageError(f"graded test {item.nodeid} has no points(n) marker")
            exercise = exercise_of(Path(str(item.path)))
            hidden = item.get_closest_marker("hidden") is not None
            self.meta[item.nodeid] = {"exercise": exercise, "points": float(points.args[0]),
                                      "visibility": "after_published" if hidden else "visible",
                                      "name": f"{exercise.module_name}: {item.name}"}
            self.probes_per_exercise[exercise.number] = self.probes_per_exercise.get(exercise.number, 0) + 1
            self._bound(exercise, item)
        order = {item.nodeid: i for i, item in enumerate(items)}
        items.sort(key=lambda item: (self.meta[item.nodeid]["exercise"].number,
                                     self.meta[item.nodeid]["visibility"] != "visible", order[item.nodeid]))
        self.order = [item.nodeid for item in items]
        self.cpu_mark = cpu_seconds()  # collecting is no exercise's

    def _bound(self, exercise, item) -> None:
        """Take the test file's ``WORKER_HEADROOM``, if any: the exercise's worker gets the least named."""
        limit = getattr(getattr(item, "module", None), "WORKER_HEADROOM", None)
        if limit is None:
            return
        if type(limit) is not int or not 0 < limit <= ADDRESS_SPACE:
            raise pytest.UsageError(f"{item.path.name}: WORKER_HEADROOM must be a number of bytes from 1 to "
                                    f"{ADDRESS_SPACE:,} (the sandbox's own limit), got {limit!r}")
        self.headroom[exercise.number] = min(limit, self.headroom.get(exercise.number, limit))

    def run_probe(self, exercise, probe, args, kwargs):
        """The data ``probe`` returns in a worker for ``exercise``; StudentError if it cannot,
        StudentLimit once the submission's budget is spent (each call gets at most what is left)."""
        name = f"{probe.__module__}:{probe.__qualname__}"
        if not getattr(probe, "__ag_probe__", False):
            raise TypeError(f"{name} is not marked @probe")
        if not probe.__module__.startswith(f"test_ex{exercise.number}_"):
            raise TypeError(f"{name}: a probe must come from a public test file of exercise "
                            f"{exercise.number} (test_ex{exercise.number}_*.py): hidden files never reach "
                            "the worker")
        try:
            if self._left() <= 0:
                raise StudentLimit(self.student_timeout)
            if exercise.number in self.broken:
                raise StudentError(self.broken[exercise.number])
            worker = self._worker_for(exercise)
            worker.timeout = min(self.timeout, self._left())
            return worker.call(name, args, kwargs)
        except StudentError:
            if self._left() <= 0:
                raise StudentLimit(self.student_timeout) from None
            raise

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    def _worker_for(self, exercise) -> Worker:
        """The worker for ``exercise``: the one in use, or a new one given what the judge chose for
        it (``payload``), the one before closed first."""
        if self.worker is not None and (self.worker_exercise is not exercise or not self.worker.alive):
            self.close()
        if self.worker is None:
            try:
                options = {"exercise": exercise.number, "headroom": self.headroom.get(exercise.number)}
                worker = Worker(payload.worker_files(exercise, self.submission, self.tests), options,
                                label=f"your {exercise.filename}", timeout=min(self.timeout, self._left()),
                                slot=self.slot, hide=self.secrets, trees=payload.worker_trees(exercise),
                                probes=self.probes_per_exercise.get(exercise.number, 1))
                worker.start()
            except StudentError as error:
                self.broken[exercise.number] = str(error)
                raise
            self.worker, self.worker_exercise = worker, exercise
        return self.worker

    def record(self, nodeid: str, passed: bool, output: str, seconds: float) -> None:
        meta = self.meta[nodeid]
        self.results[nodeid] = {
            "name": meta["name"], "max_score": meta["points"], "score": meta["points"] if passed else 0.0,
            "status": "passed" if passed else "failed", "output": clip(output, MAX_TEST_OUTPUT),
            "visibility": meta["visibility"], "seconds": round(seconds, 3)}

    def close(self) -> None:
        """Close the worker in use, and charge the CPU seconds since the last close to its exercise."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None
            now, name = cpu_seconds(), self.worker_exercise.module_name
            self.cpu[name] = self.cpu.get(name, 0.0) + now - self.cpu_mark
            self.cpu_mark = now


def cpu_seconds() -> float:
    """User + system seconds of this process and of the children it has reaped (a closed worker's)."""
    mine, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


_session: Session | None = None


def pytest_addoption(parser) -> None:
    group = parser.getgroup("ag grade")
    group.addoption("--ag-submission", help="the student's folder")
    group.addoption("--ag-timeout", type=float, default=60.0, help="seconds per probe")
    group.addoption("--ag-student-timeout", type=float, default=None, help="seconds for the whole submission")
    group.addoption("--ag-slot", type=int, default=0, help="which worker user a parallel job uses")
    group.addoption("--ag-hide", action="append", default=[], help="a path the worker must not see")


def pytest_configure(config) -> None:
    global _session
    config.addinivalue_line("markers", "points(n): what the test is worth in a graded run")
    config.addinivalue_line("markers", "hidden: a test students do not see before grades are published")
    submission = config.getoption("--ag-submission")
    if submission:
        _session = Session(Path(submission).resolve(), Path(str(config.args[0])).resolve(),
                           config.getoption("--ag-timeout"), config.getoption("--ag-slot"),
                           config.getoption("--ag-hide"), config.getoption("--ag-student-timeout"))
        if threading.current_thread() is threading.main_thread():
            config.stash[_sigterm_was] = signal.signal(signal.SIGTERM, _stop_on_sigterm) or signal.SIG_DFL


def pytest_unconfigure(config) -> None:
    if _sigterm_was in config.stash:
        signal.signal(signal.SIGTERM, config.stash[_sigterm_was])


_sigterm_was = pytest.StashKey[object]()


def _stop_on_sigterm(signum, frame) -> None:
    """A judge told to stop kills its workers and removes their cgroups and its stubbed packages
    before it goes; no results are written."""
    kill_all()
    payload.remove_packages()
    os._exit(128 + signum)


def pytest_collection_modifyitems(session, config, items) -> None:
    if _session is not None:
        _session.collect(items)


class Probes:
    """``worker(probe, *args, **kwargs)``: run ``probe`` in the sandbox on the student's exercise
    and these arguments (plain data and NumPy arrays), and return what it returned, as data.
    ``worker.once(probe, *args, **kwargs)``: the same, run once per submission; a later call with
    the same probe and arguments gets the same data or fails the same way (a long probe that
    several tests check)."""

    def __init__(self, session: Session, exercise) -> None:
        self.session, self.exercise = session, exercise

    def __call__(self, probe, *args, **kwargs):
        try:
            return self.session.run_probe(self.exercise, probe, args, kwargs)
        except SandboxError as error:
            pytest.exit(f"ag grade: {error}", returncode=3)

    def once(self, probe, *args, **kwargs):
        request = channel.encode([f"{probe.__module__}:{probe.__qualname__}", list(args), dict(kwargs)])
        key = hashlib.sha256(request).hexdigest()
        if key not in self.session.once:
            try:
                self.session.once[key] = (True, self(probe, *args, **kwargs))
            except StudentError as error:
                self.session.once[key] = (False, str(error))
        ran, value = self.session.once[key]
        if not ran:
            raise StudentError(value)
        return value


@pytest.fixture
def worker(request) -> Probes:
    """The student's exercise, through its sandboxed worker (``Probes``)."""
    if _session is None:
        raise pytest.UsageError("graded tests run under `ag grade` (python -m ag.course.judge)")
    return Probes(_session, _session.meta[request.node.nodeid]["exercise"])


def pytest_runtest_setup(item) -> None:
    item.stash[_started] = time.perf_counter()


_started = pytest.StashKey[float]()


def pytest_runtest_makereport(item, call) -> None:
    if _session is None or item.nodeid not in _session.meta:
        return
    seconds = time.perf_counter() - item.stash.get(_started, time.perf_counter())
    if call.excinfo is not None and call.when in ("setup", "call"):
        _session.record(item.nodeid, False, _message(call.excinfo.value), seconds)
    elif call.when == "call":
        _session.record(item.nodeid, True, "", seconds)


def pytest_sessionfinish(session, exitstatus) -> None:
    if _session is not None:
        _session.close()


def _message(error: BaseException) -> str:
    """What a failed test says: the check's own message (never its source or a traceback)."""
    if isinstance(error, StudentLimit):
        return str(error)
    if isinstance(error, StudentError):  # its text comes from the student's side: shown as code
        return f"Your code failed here:\n\n{fenced(str(error))}"
    if isinstance(error, AssertionError):
        return str(error) or "the check failed"
    if isinstance(error, pytest.skip.Exception):
        return f"skipped: {error}"
    return f"The check could not be completed:\n\n{fenced(f'{type(error).__name__}: {str(error)[:500]}')}"


def main(argv: list[str] | None = None) -> int:
    """Grade the submissions named on stdin, one JSON request per line ({"submission", "out"}),
    each in a fresh pytest session; answer each with one JSON line on stdout. pytest, NumPy and
    the graded tests are imported once, however many students a class has."""
    parser = argparse.ArgumentParser(prog="python -m ag.course.judge", description=__doc__.splitlines()[0])
    parser.add_argument("--tests", required=True)
    parser.add_argument("--ini", required=True, help="an empty pytest.ini in the caller's folder (removed by it, "
                        "however the judge ends): the graded tests run under no one else's configuration")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--student-timeout", type=float, default=None)
    parser.add_argument("--slot", type=int, default=0)
    parser.add_argument("--hide", action="append", default=[])
    parser.add_argument("-k", dest="select", help="only the tests whose names match (pytest's -k)")
    args = parser.parse_args(argv)
    # only ag's plugin: another installed one (nbmake, hypothesis) would cost seconds of imports per
    # submission and could change how the graded tests run
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    signal.signal(signal.SIGTERM, _interrupted)  # stopped by `grade`: pytest's finish closes the workers
    replies = sys.stdout
    sys.stdout = sys.stderr  # pytest's report is a log; stdout carries only the replies
    ini = Path(args.ini)
    for line in sys.stdin:
        request = json.loads(line)
        reply = _grade_one(args, ini, request["submission"], Path(request["out"]))
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # no next student: a stop must not cut the cleanup short
    payload.remove_packages()
    return 0


def _grade_one(args, ini: Path, submission: str, out: Path) -> dict:
    global _session
    # no:unraisableexception: it collects garbage five times at each session's end, for warnings the judge ignores
    options = [args.tests, "-c", str(ini), "--rootdir", args.tests, "-p", "ag.course.judge", "-p",
               "no:cacheprovider", "-p", "no:unraisableexception", "--assert=plain", "-q", "--no-header",
               "--tb=short", "-W", "ignore",
               "--ag-submission", submission, "--ag-timeout", str(args.timeout), "--ag-slot", str(args.slot)]
    if args.student_timeout:
        options += ["--ag-student-timeout", str(args.student_timeout)]
    for path in args.hide:
        options += ["--ag-hide", path]
    if args.select:
        options += ["-k", args.select]
    _session = None
    code = pytest.main(options)
    session = _session
    if session is not None:
        session.close()  # every worker is gone before anything is written
    if session is None or code not in (0, 1):
        return {"error": f"the judge stopped (pytest exit code {code}); see its log above"}
    ordered = [session.results[nodeid] for nodeid in session.order if nodeid in session.results]
    out.write_text(json.dumps({"tests": ordered, "cpu": session.cpu}))
    return {"ok": True}


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    # main runs in ag.course.judge, the module pytest loads as the plugin, not in this __main__ copy
    from ag.course.judge import main as plugin_main
    sys.exit(plugin_main())
