"""Grading a class: K copies of solutions/ graded by ``ag.course.batch.grade_class``.

    python benchmarks/grading.py                    # 300 students, as many at once as there are cores
    python benchmarks/grading.py --students 4       # a few students; the time is scaled to 300
    python benchmarks/grading.py --students 4 --slow 1 --student-timeout 60   # and one that sleeps in every test

Every student is a copy of solutions/, so every student must get full marks; the goal is the
course's: a class of 300 graded on this machine in at most 15 minutes. With fewer students than
300 the figure is scaled linearly from the seconds per student, and the output says so. With
``--slow K``, K more students sleep past the timeout in every test (stubs, so they score 0): each
may hold its job up by at most the per-student cap, which the output checks.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ag.course import EXERCISES, REPO  # noqa: E402
from ag.course.batch import grade_class  # noqa: E402
from ag.course.grade import student_limit  # noqa: E402
from ag.lab.threads import cores  # noqa: E402
from mlp import cpu_line  # noqa: E402

CLASS = 300
GOAL_SECONDS = 15 * 60


def make_class(root: Path, students: int) -> Path:
    """``students`` folders, each a copy of solutions/'s exercise files."""
    for i in range(students):
        folder = root / f"student{i:03d}"
        folder.mkdir(parents=True)
        for file in sorted((REPO / "solutions").glob("ex*.py")):
            shutil.copy(file, folder)
    return root


SLEEP_IN_EVERY_FUNCTION = """

import time as _time


def _slow(function):
    def slept(*args, **kwargs):
        _time.sleep({seconds})
        return function(*args, **kwargs)
    return slept


for _name in {names!r}:
    globals()[_name] = _slow(globals()[_name])
"""


def make_slow(folder: Path, seconds: float) -> Path:
    """A student folder of stubs whose graded functions sleep ``seconds`` first."""
    folder.mkdir(parents=True)
    for e in EXERCISES:
        names = [name for _, name in e.functions]
        text = (REPO / "exercises" / e.filename).read_text()
        (folder / e.filename).write_text(text + SLEEP_IN_EVERY_FUNCTION.format(seconds=seconds, names=names))
    return folder


def slow_line(slow, cap: float) -> str:
    """Whether each slow student was graded (0 points) within the cap, with a little for starting workers."""
    held = max(r.seconds for r in slow.values())
    ok = all(r.graded and r.score == 0 for r in slow.values()) and held <= cap + 15
    return (f"{len(slow)} slow student(s): graded in at most {held:.1f} s each, against a cap of {cap:g} s: "
            + ("held" if ok else "MISSED (" + "; ".join(r.error for r in slow.values() if not r.graded) + ")"))


def missed_marks(reports) -> list[str]:
    """One line per student without full marks (the copies of solutions/ must all get them)."""
    full = max(r.max_score for r in reports.values())
    lines = []
    for student, report in reports.items():
        if not report.graded:
            lines.append(f"{student}: not graded: {report.error}")
        elif report.score < full:
            failed = [t.name for t in report.tests if t.status != "passed"]
            lines.append(f"{student}: {report.score:g} / {full:g}; failed: {', '.join(failed[:3])}"
                         + (f" and {len(failed) - 3} more" if len(failed) > 3 else ""))
    return lines


def time_by_exercise(reports) -> str:
    """Mean seconds per student in each exercise's tests, and in the rest (starting the judge, workers)."""
    seconds = {e.module_name: 0.0 for e in EXERCISES}
    for report in reports.values():
        for test in report.tests:
            if test.exercise in seconds:
                seconds[test.exercise] += test.seconds / len(reports)
    rest = statistics.fmean(r.seconds for r in reports.values()) - sum(seconds.values())
    return ", ".join(f"{name.split('_')[0]} {s:.2f}" for name, s in seconds.items()) + f", the rest {rest:.2f}"


def cpu_by_exercise(reports, cpu_per_student: float) -> str:
    """Mean CPU seconds per student in each exercise (the judge's checks and the exercise's workers,
    as the judge counts them), and in the rest (starting the judge, collecting the tests)."""
    cpu = {e.module_name: statistics.fmean(r.cpu.get(e.module_name, 0.0) for r in reports.values())
           for e in EXERCISES}
    rest = cpu_per_student - sum(cpu.values())
    return ", ".join(f"{name.split('_')[0]} {s:.2f}" for name, s in cpu.items()) + f", the rest {rest:.2f}"


def children_cpu() -> float:
    """CPU seconds (user + sys) of the processes this one started and waited for: judges, their workers."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=CLASS, help=f"class size K (default {CLASS})")
    parser.add_argument("--jobs", type=int, default=cores(), help="students at once (default: the cores it may use)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per test (default 60)")
    parser.add_argument("--student-timeout", type=float, default=None, help="seconds per student (default: "
                        "ag grade's, 5 x --timeout, at least 120)")
    parser.add_argument("--slow", type=int, default=0, help="more students who sleep past the timeout in every test")
    args = parser.parse_args()
    cap = student_limit(args.timeout, args.student_timeout)

    print(f"Grading a class of {args.students} copies of solutions/, {args.jobs} at a time")
    print(cpu_line())
    print(f"load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="ag-class-") as temp:
        folder = make_class(Path(temp) / "class", args.students)
        for i in range(args.slow):
            make_slow(folder / f"slow{i:03d}", args.timeout + 1)
        started = time.perf_counter()
        reports = grade_class(folder, jobs=args.jobs, timeout=args.timeout, csv_path=Path(temp) / "gradebook.csv",
                              json_dir=Path(temp) / "results", student_timeout=cap)
        seconds = time.perf_counter() - started
    slow = {s: reports.pop(s) for s in list(reports) if s.startswith("slow")}

    if slow:
        print(slow_line(slow, cap))
        seconds -= sum(r.seconds for r in slow.values()) / args.jobs  # the class's own time, without them
    per_student = seconds / args.students
    class_seconds = per_student * CLASS
    plural = "s" if args.students > 1 else ""
    scaled = "" if args.students == CLASS else f", scaled linearly from {args.students} student{plural}"
    print(f"\n{seconds:.1f} s in all, {per_student:.2f} s per student ({args.jobs} at a time)")
    print(f"a class of {CLASS}: {class_seconds / 60:.1f} min{scaled}")
    print(f"one student's grading, seconds by exercise: {time_by_exercise(reports)}")
    cpu = children_cpu() / (args.students + args.slow)
    print(f"CPU: {cpu:.2f} s a student (the judges' and workers' user + sys: less sensitive than the wall time "
          "to other load on the machine)")
    if not slow:
        print(f"one student's grading, CPU seconds by exercise: {cpu_by_exercise(reports, cpu)}")
    missed = missed_marks(reports)
    print("every student got full marks" if not missed else f"MISSED: {len(missed)} student(s) without full marks")
    for line in missed[:10]:
        print(f"  {line}")
    verdict = "met" if class_seconds <= GOAL_SECONDS else "missed"
    print(f"goal: a class of {CLASS} on this machine in at most {GOAL_SECONDS // 60} minutes: {verdict}")


if __name__ == "__main__":
    main()
