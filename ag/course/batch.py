"""Grading a whole class: one folder per student, several students graded at once, then a
gradebook CSV and one Gradescope results.json per student.

Each student's folder goes through the intake station (``intake``) inside ``Judge.grade``: what
it did not take (a link, a bad notebook) is noted in the gradebook's error column.
"""
from __future__ import annotations

import csv
import json
import os
import queue
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .exercises import EXERCISES
from .grade import Judge, Report, TestResult

MAX_ERROR = 10_000  # characters of a failed grading kept in the student's results
MAX_ERROR_LINE = 300  # and in the gradebook


def grade_class(folder: Path | str, tests: Path | str | None = None, *, jobs: int = 1, timeout: float = 60.0,
                csv_path: Path | str | None = None, json_dir: Path | str | None = None,
                progress: bool = True) -> dict[str, Report]:
    """Grade every student folder under ``folder``, ``jobs`` students at a time.

    Writes the gradebook (``csv_path``: student, points per exercise, total, max_total, error)
    and ``json_dir/<student>.json``, Gradescope's results for each. A student whose grading
    raises gets 0 and the error, one line, in the gradebook; the others are graded all the same.
    """
    students = student_folders(folder)
    if json_dir is not None:
        Path(json_dir).mkdir(parents=True, exist_ok=True)
    reports, errors = {}, {}
    bar = Progress(len(students), enabled=progress)
    # the workers see neither the results nor the class (they get the intake's copies)
    hide = [Path(p).resolve() for p in (csv_path, json_dir, folder) if p is not None]
    for student, report, error in _graded(students, tests, jobs, timeout, hide):
        reports[student] = report
        if error:
            errors[student] = error
        if json_dir is not None:
            _write_json(Path(json_dir) / f"{student}.json", report)
        bar.advance()
    reports = dict(sorted(reports.items()))
    if csv_path is not None:
        write_gradebook(csv_path, reports, errors)
    return reports


def student_folders(folder: Path | str) -> dict[str, Path]:
    """The students of a class folder, by name, sorted: its subfolders, hidden ones left out."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotADirectoryError(f"grade_class: {folder} is not a folder")
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_dir() and not p.name.startswith((".", "__"))}


def _graded(students: dict[str, Path], tests, jobs: int, timeout: float, hide: list[Path]):
    """(student, report, error) as each student's grading finishes; each thread keeps one slot and
    one judge process, which grades its students one after another."""
    jobs = max(1, min(jobs, len(students) or 1))
    slots: queue.SimpleQueue[int] = queue.SimpleQueue()
    for slot in range(jobs):
        slots.put(slot)
    local = threading.local()
    judges: list[Judge] = []

    def work(student: str) -> tuple[str, Report, str]:
        if not hasattr(local, "slot"):
            local.slot = slots.get()
        if getattr(local, "judge", None) is None:
            local.judge = Judge(tests, timeout=timeout, slot=local.slot, hide=hide)
            judges.append(local.judge)
        report, error = _grade_student(local.judge, students[student])
        if error.startswith("grading failed"):  # the judge may be gone: the next student gets a new one
            local.judge = None
        return student, report, error

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="ag-grade")
    try:
        for future in as_completed([pool.submit(work, s) for s in students]):
            yield future.result()
    finally:
        pool.shutdown(cancel_futures=True)  # after Ctrl-C, the students not started yet are not graded
        for judge in judges:
            judge.close()


def _grade_student(judge: Judge, folder: Path) -> tuple[Report, str]:
    """The student's report and a one-line error ("" when grading went through)."""
    try:
        if folder.is_symlink():  # an archive's link among the students: whatever it names is no one's upload
            raise NotADirectoryError(f"{folder.name} is a link, not a student's folder: links are not followed")
        report = judge.grade(folder)
        return report, "; ".join(report.notes)
    except Exception as error:  # one student's failure never stops the class
        text = f"grading failed: {type(error).__name__}: {error}"
        line = " ".join(text.split())
        return Report(tests=[TestResult(name="grading", max_score=0.0, score=0.0, status="failed",
                                        output=text[:MAX_ERROR])]), line[:MAX_ERROR_LINE]


def write_gradebook(path: Path | str, reports: dict[str, Report], errors: dict[str, str]) -> Path:
    """The gradebook CSV, written to a temporary file and renamed into place."""
    path = Path(path)
    max_total = max((r.max_score for r in reports.values()), default=0.0)
    header = ["student", *(e.module_name for e in EXERCISES), "total", "max_total", "error"]
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(header)
            for student, report in reports.items():
                points = report.by_exercise().values()
                writer.writerow([student, *(f"{p:g}" for p in points), f"{report.score:g}", f"{max_total:g}",
                                 errors.get(student, "")])
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
    return path


def _write_json(path: Path, report: Report) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(report.gradescope(), indent=2))
    os.replace(temp, path)


class Progress:
    """done/total, students per second and the time left on stderr: in place on a terminal,
    otherwise a line every tenth of the class."""

    def __init__(self, total: int, *, enabled: bool = True, stream=None) -> None:
        self.total, self.done, self.enabled = total, 0, enabled and total > 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.perf_counter()
        self.step = max(1, -(-total // 10))

    def advance(self) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.tty:
            self.stream.write(f"\r{self.line()}\x1b[K" + ("\n" if self.done == self.total else ""))
        elif self.done % self.step == 0 or self.done == self.total:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def line(self) -> str:
        elapsed = time.perf_counter() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        filled = round(20 * self.done / self.total)
        return (f"grading [{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} students, "
                f"{rate:.2f}/s, ETA {_clock(left)}")


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}:{seconds:02d}" if minutes < 60 else f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"
