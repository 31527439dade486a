"""Grading a whole class: one folder per student, several students graded at once, then a
gradebook CSV and one Gradescope results.json per student.

Each student's folder goes through the intake station (``intake``) inside ``Judge.grade``: what
it did not take (a link, a bad notebook) is noted in the gradebook's error column. A student who
could not be graded is never written down as 0 points: the gradebook row has no points and says
why. Every file is written whole (``writing``), every text cell neutralised (``escape``).
"""
from __future__ import annotations

import csv
import io
import json
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .escape import for_csv, for_terminal
from .exercises import EXERCISES
from .grade import Judge, Report
from .writing import check_target, write_new

MAX_ERROR_LINE = 300  # characters of why a student was not graded, in the gradebook


def grade_class(folder: Path | str, tests: Path | str | None = None, *, jobs: int = 1, timeout: float = 60.0,
                csv_path: Path | str | None = None, json_dir: Path | str | None = None,
                progress: bool = True, student_timeout: float | None = None) -> dict[str, Report]:
    """Grade every student folder under ``folder``, ``jobs`` students at a time.

    Writes the gradebook (``csv_path``: student, points per exercise, total, max_total, error)
    and ``json_dir/<student>.json``, Gradescope's results for each. A student whose grading
    fails gets a Report with ``error`` set: no points and "not graded: why" in the gradebook, no
    results file; the others are graded all the same. A link where a result file goes is refused.
    """
    students = student_folders(folder, results=json_dir)
    if csv_path is not None:
        check_target(csv_path)
    if json_dir is not None:
        Path(json_dir).mkdir(parents=True, exist_ok=True)
    reports, notes = {}, {}
    bar = Progress(len(students), enabled=progress)
    # the workers see neither the results nor the class (they get the intake's copies)
    hide = [Path(p).resolve() for p in (csv_path, json_dir, folder) if p is not None]
    for student, report, note in _graded(students, tests, jobs, timeout, hide, student_timeout):
        if json_dir is not None:
            report = _write_json(Path(json_dir) / f"{student}.json", report)
        reports[student] = report
        if note:
            notes[student] = note
        bar.advance()
    reports = dict(sorted(reports.items()))
    if csv_path is not None:
        write_gradebook(csv_path, reports, notes)
    return reports


def student_folders(folder: Path | str, results: Path | str | None = None) -> dict[str, Path]:
    """The students of a class folder, by name, sorted: its subfolders, but for hidden ones (".", "__")
    and the ``results`` folder, each left out with a line on stderr saying so."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotADirectoryError(f"grade_class: {folder} is not a folder")
    results = Path(results).resolve() if results is not None else None
    students = {}
    for p in sorted(folder.iterdir()):
        if not p.is_dir():
            continue
        if p.name.startswith((".", "__")) or p.resolve() == results:
            print(f"grade: {for_terminal(p.name)} left out: a hidden folder or the results' folder", file=sys.stderr)
        else:
            students[p.name] = p
    return students


def _graded(students: dict[str, Path], tests, jobs: int, timeout: float, hide: list[Path],
            student_timeout: float | None = None):
    """(student, report, notes) as each student's grading finishes; each thread keeps one slot and
    one judge process, which grades its students one after another (a new one after a failure)."""
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
            local.judge = Judge(tests, timeout=timeout, slot=local.slot, hide=hide, student_timeout=student_timeout)
            judges.append(local.judge)
        report, notes = _grade_student(local.judge, students[student])
        if not report.graded:  # the judge may be gone or stuck: the next student gets a new one
            local.judge.stop()
            local.judge = None
        return student, report, notes

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="ag-grade")
    try:
        for future in as_completed([pool.submit(work, s) for s in students]):
            yield future.result()
    finally:
        pool.shutdown(cancel_futures=True)  # after Ctrl-C, the students not started yet are not graded
        for judge in judges:
            judge.close()


def _grade_student(judge: Judge, folder: Path) -> tuple[Report, str]:
    """The student's report (``error`` set if they could not be graded) and the notes on what was skipped."""
    try:
        if folder.is_symlink():  # an archive's link among the students: whatever it names is no one's upload
            raise NotADirectoryError(f"{folder.name} is a link, not a student's folder: links are not followed")
        report = judge.grade(folder)
        return report, "; ".join(report.notes)
    except Exception as error:  # one student's failure never stops the class
        return Report(error=_one_line(f"{type(error).__name__}: {error}")), ""


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MAX_ERROR_LINE]


def write_gradebook(path: Path | str, reports: dict[str, Report], notes: dict[str, str]) -> Path:
    """The gradebook CSV, written whole; a student not graded has empty points and "not graded: why"."""
    max_total = max((r.max_score for r in reports.values() if r.graded), default=0.0)
    header = ["student", *(e.module_name for e in EXERCISES), "total", "max_total", "error"]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for student, report in reports.items():
        if report.graded:
            points = [f"{p:g}" for p in (*report.by_exercise().values(), report.score)]
            error = notes.get(student, "")
        else:
            points, error = [""] * (len(EXERCISES) + 1), f"not graded: {report.error}"
        writer.writerow([for_csv(student), *points, f"{max_total:g}", for_csv(error)])
    return write_new(path, out.getvalue())


def _write_json(path: Path, report: Report) -> Report:
    """Write the student's results.json; the report, or a report not graded if the file was refused.
    A student not graded gets no results file (and loses a stale one from an earlier run). A file that
    cannot be written (a link in its way, a folder name too long for one) costs that student only."""
    try:
        if report.graded:
            write_new(path, json.dumps(report.gradescope(), indent=2))
        elif check_target(path).exists():
            path.unlink()
    except OSError as error:  # UnsafeTarget included
        return Report(error=_one_line(f"results not written: {error}"))
    return report


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
