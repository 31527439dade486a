"""The ``ag`` command line: ``ag demo memory`` and, as later parts land, more."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path

from . import course, demo, parallel
from .attention import gpu
from .course import batch, intake
from .course.assign import release
from .course.notebook import NOTEBOOKS
from .course.escape import for_terminal, plain_text
from .course.grade import student_limit
from .course.writing import UnsafeTarget, check_target, write_new

PARALLEL_LAUNCH = "mpiexec -n 2 ag demo parallel"
DEMOS = {
    "memory": "array sizes, tracemalloc, lazy and discarded grads (the lecture's tables)",
    "remat": "every checkpoint strategy on a 10-layer chain: peak MB, matmuls by phase, plots; with --graph, "
             "every planner (Checkmate's MILP, LP rounding, DTR, NeMo's modes) on three captured graphs",
    "attention": "peak memory of naive and flash attention as N grows, with a log-log plot",
    "transformer": "activation bytes of float16 transformer layers against sbh(34 + 5as/h), by recomputation",
    "wall": "one training step of a GPT-like model by slice (parameters, gradients, optimizer state, activations) "
            "at three sizes and two batch sizes, measured beside the formulas, with mixed precision's cut",
    "train": "an MLP on scikit-learn's digits and a character-level transformer on the Zen of Python, with progress bars",
    "parallel": f"tensor + sequence parallel layers, bytes per rank; launch as `{PARALLEL_LAUNCH}`",
}
# environment variables an MPI launcher sets in every rank (MPICH's hydra, Open MPI, PMIx)
MPI_LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


def _demo(args: argparse.Namespace) -> int:
    if args.name == "parallel":
        return _parallel(args.extra)
    if args.graph and args.name != "remat":
        print(f"ag demo {args.name}: --graph applies to the remat demo only", file=sys.stderr)
        return 2
    if args.html and (args.name not in ("memory", "remat") or args.graph):
        print(f"ag demo {args.name}: --html applies to the memory and remat demos only, without --graph "
              "(they record timelines)", file=sys.stderr)
        return 2
    if args.html and importlib.util.find_spec("bokeh") is None:
        print(f"ag demo {args.name} --html: the interactive timeline needs bokeh: pip install 'ag[plot]'",
              file=sys.stderr)
        return 1
    if args.device == "gpu":
        if args.name != "attention":
            print(f"ag demo {args.name}: --device gpu applies to the attention demo only", file=sys.stderr)
            return 2
        ready, reason = gpu.available()
        if not ready:
            print(f"ag demo attention --device gpu: no GPU here: {reason}", file=sys.stderr)
            return 1
    if args.name == "memory":
        demo.memory(args.out, html=args.html)
        return 0
    args.out = args.out or "ag-plots"
    if args.name == "remat" and args.graph:
        demo.remat_graph_demo(args.out, budgets=args.budgets, time_limit=args.time_limit)
    elif args.name == "remat":
        demo.remat_demo(args.out, html=args.html)
    elif args.name == "attention":
        demo.attention_demo(args.out, device=args.device)
    elif args.name == "transformer":
        demo.transformer_demo(args.out)
    elif args.name == "wall":
        demo.wall_demo(args.out)
    elif args.name == "train":
        demo.train_demo(args.out)
    return 0


def _parallel(argv: list[str]) -> int:
    """Run ``ag.parallel.main`` in this rank; one process alone only gets told how to launch it."""
    if not any(name in os.environ for name in MPI_LAUNCHER_VARIABLES):
        print(f"ag demo parallel is meant to be launched by MPI, one process per rank: {PARALLEL_LAUNCH} "
              "(or -n 4); running it in this single process", file=sys.stderr)
    try:
        return parallel.main(argv) or 0
    except ImportError as error:  # mpi4py, imported when the first group is made
        print(f"ag demo parallel: {error}; then {PARALLEL_LAUNCH}", file=sys.stderr)
        return 1


def _assign(args: argparse.Namespace) -> int:
    if args.release and args.format == "notebook":
        print("ag assign: --release writes the .py exercises; nbgrader makes the notebooks' release itself "
              f"(nbgrader generate_assignment, in {NOTEBOOKS.parent}/)", file=sys.stderr)
        return 2
    if args.release:
        try:
            written = release(args.release)
        except (ValueError, FileNotFoundError) as error:
            print(f"ag assign: {error}", file=sys.stderr)
            return 2
        print(f"release written to {args.release}: {len(written)} file(s), every exercise a stub"
              + "".join(f"\n  {p}" for p in written))
        return 0
    root = Path(args.root) if args.root else course.REPO
    # --check also checks the notebooks wherever they were written, so that they are kept in sync
    notebooks = args.format == "notebook" or (args.check and args.format is None and (root / NOTEBOOKS).is_dir())
    try:
        stale = course.assign(args.root, check=args.check, formats=("py", "notebook") if notebooks else ("py",))
    except ImportError as error:
        print(f"ag assign: {error}", file=sys.stderr)
        return 2
    if args.check:
        for path in stale:
            print(f"out of sync with its source in ag/: {path}")
        if notebooks:
            print(f"exercises/, solutions/ and {NOTEBOOKS}/ are in sync" if not stale
                  else "run `ag assign --format notebook` to regenerate")
        else:
            print("exercises/ and solutions/ are in sync" if not stale else "run `ag assign` to regenerate")
        return 1 if stale else 0
    print(f"wrote {len(stale)} file(s)" + "".join(f"\n  {p}" for p in stale))
    return 0


def _say(message: str) -> None:
    """An error sentence on stderr, whatever a submission put in it shown as escapes."""
    print(for_terminal(message, lines=True), file=sys.stderr)



def _grade(args: argparse.Namespace) -> int:
    if args.autograder:
        return _autograder(args.autograder)
    if not args.submission:
        _say("ag grade: give a submission folder, or --autograder OUT.zip")
        return 2
    submission = Path(args.submission)
    if not submission.is_dir():
        what = "is a file" if submission.exists() else "does not exist"
        _say(f"ag grade: {submission} {what}: give the folder that holds the exN_*.py files or notebooks "
             "(or a class folder, one subfolder per student)")
        return 2
    args.tests = _graded_tests(args.tests)
    if args.tests is None:
        return 2
    if _is_class(args.submission, class_flags=bool(args.csv or args.json_dir)):
        return _grade_class(args)
    if args.csv or args.json_dir:
        _say(f"ag grade: {args.submission} holds one student's exercise files; --csv and --json-dir are for a "
             "class folder (one subfolder per student), use --json")
        return 2
    return _grade_one(args)


def _grade_one(args: argparse.Namespace) -> int:
    """One student: each test's line (and a failed test's message), the score, results.json if asked."""
    try:
        if args.json:
            check_target(args.json)
            Path(args.json).resolve().parent.mkdir(parents=True, exist_ok=True)
        # student code never sees the results, nor the upload (the workers get the intake's copy)
        hide = [Path(args.json).resolve().parent] if args.json else []
        hide.append(Path(args.submission).resolve().parent)
        report = course.grade(args.submission, args.tests, timeout=args.timeout, hide=hide,
                              student_timeout=args.student_timeout)
    except UnsafeTarget as error:
        _say(f"ag grade: --json: {error}")
        return 2
    except RuntimeError as error:  # the judge itself failed: no grade, no results file
        _say(f"ag grade: not graded: {error}")
        return 3
    for note in report.notes:
        _say(f"skipped: {note}")
    _print_report(report, quiet=args.quiet)
    if args.json:
        try:
            write_new(args.json, json.dumps(report.gradescope(), indent=2))
        except UnsafeTarget as error:
            _say(f"ag grade: --json: {error}")
            return 2
        print(f"results written: {for_terminal(args.json)}")
    return 0


def _print_report(report, *, quiet: bool) -> None:
    """A line per test, and under a failed one its message (expected, got, the input), as pytest does."""
    for t in report.tests:
        print(f"{t.status:>6}  {t.score:4g}/{t.max_score:<4g} {for_terminal(t.name)}")
        if t.status != "passed" and t.output and not quiet:
            print(textwrap.indent(for_terminal(plain_text(t.output), lines=True), "        | ", lambda line: True))
    print(f"score: {report.score:g} / {report.max_score:g}")


def _graded_tests(given: str | None) -> str | None:
    """The graded tests folder: ``--tests``, or tests/grading in the repository ag runs from."""
    if given:
        if Path(given).is_dir():
            return given
        _say(f"ag grade: --tests {given}: no such folder (the graded tests, e.g. the handout's tests/grading)")
        return None
    default = course.REPO / "tests" / "grading"
    if default.is_dir():
        return str(default)
    _say(f"ag grade: no --tests given, and this ag ({course.PACKAGE}) is installed without the course's "
         f"repository around it, so there is no {default}: pass --tests FOLDER, the graded tests (the "
         "handout's tests/grading, or the course checkout's)")
    return None


def _autograder(out: str) -> int:
    """Gradescope's bundle, built from the course's repository (ag's source and its graded tests)."""
    repo = course.REPO
    if not ((repo / "pyproject.toml").is_file() and (repo / "tests" / "grading").is_dir()):
        _say(f"ag grade --autograder: the bundle is built from the course's repository (pyproject.toml, ag/, "
             f"tests/grading), and this ag ({course.PACKAGE}) is installed without one: run it from a checkout "
             "(pip install -e . there)")
        return 2
    path = course.autograder_bundle(out, root=repo)
    print(f"Gradescope autograder bundle written: {for_terminal(path)}")
    return 0


def _is_class(folder: str, *, class_flags: bool) -> bool:
    """A class folder holds one subfolder per student; one student's upload holds its files at the
    top or in one enclosing folder (intake.locate), which --csv or --json-dir read as a class of one."""
    if not Path(folder).is_dir():
        return False
    where = intake.locate(folder)
    return where is None or (where != "" and class_flags)


def _grade_class(args: argparse.Namespace) -> int:
    """A class: each student's total, the mean; exit 3 if any student could not be graded, each named."""
    if args.json:
        _say("ag grade: --json is for one student; a class writes one results file each with --json-dir")
        return 2
    started = time.perf_counter()
    try:
        reports = batch.grade_class(args.submission, args.tests, jobs=args.jobs, timeout=args.timeout,
                                    csv_path=args.csv, json_dir=args.json_dir, student_timeout=args.student_timeout)
    except UnsafeTarget as error:
        _say(f"ag grade: --csv: {error}")
        return 2
    seconds = time.perf_counter() - started
    graded = {s: r for s, r in reports.items() if r.graded}
    max_total = max((r.max_score for r in graded.values()), default=0.0)
    for student, report in graded.items():
        print(f"{report.score:6g}/{max_total:<4g} {for_terminal(student)}")
    mean = statistics.fmean(r.score for r in graded.values()) if graded else 0.0
    print(f"students: {len(reports)}, graded: {len(graded)}, mean total: {mean:.1f} / {max_total:g}, time: "
          f"{seconds:.1f} s ({seconds / max(1, len(reports)):.1f} s per student, {args.jobs} at a time)")
    for label, path in (("gradebook", args.csv), ("results", args.json_dir)):
        if path:
            print(f"{label} written: {for_terminal(path)}")
    for student, report in reports.items():
        if not report.graded:
            _say(f"not graded: {for_terminal(student)}: {report.error}")
    return 3 if len(graded) < len(reports) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ag", description="ag: a NumPy autograd engine that teaches memory and IO in deep learning")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    demo = commands.add_parser("demo", help="run a lecture demo and print its measured tables",
                               description="Run a lecture demo: " + "; ".join(
                                   f"{k}: {v}" for k, v in DEMOS.items()))
    demo.add_argument("name", choices=sorted(DEMOS), help="which demo")
    demo.add_argument("--out", help="folder for the plots (default: ag-plots; memory draws its plot only "
                      "when given one)")
    demo.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                      help="attention only: gpu runs CuPy arrays and traces CuPy's memory pool")
    demo.add_argument("--graph", action="store_true",
                      help="remat only: every planner on three captured graphs, Checkmate's Figure 4 "
                           "(needs the solver extra)")
    demo.add_argument("--budgets", type=int, default=5, help="remat --graph: budgets per graph (default 5)")
    demo.add_argument("--time-limit", type=float, default=10.0,
                      help="remat --graph: seconds per MILP solve (default 10)")
    demo.add_argument("--html", metavar="PATH", default=None,
                      help="memory and remat: also write the memory timeline to PATH, one interactive HTML "
                           "file that works offline (needs the plot extra)")
    demo.set_defaults(run=_demo)
    assign = commands.add_parser("assign", help="generate exercises/ and solutions/ from the marked regions in ag/")
    assign.add_argument("--check", action="store_true", help="only check they are in sync (exit 1 if not)")
    assign.add_argument("--root", default=None, help="the repository (default: the one ag is in)")
    assign.add_argument("--release", metavar="DIR", default=None,
                        help="write what students receive to DIR instead: exercises/, ag with every "
                             "exercise a stub (pip-installable), the public graded tests")
    assign.add_argument("--format", choices=("py", "notebook"), default=None,
                        help="py (the default): exercises/ and solutions/; notebook: also nbgrader's source "
                             "notebooks, nbgrader/source/exN_name/exN_name.ipynb (needs jupytext). --check "
                             "checks the notebooks too whenever nbgrader/source/ exists")
    assign.set_defaults(run=_assign)
    grade = commands.add_parser("grade", help="run the graded tests on a student's folder (Gradescope results)")
    grade.add_argument("submission", nargs="?", help="folder holding the student's exN_*.py files or .ipynb "
                       "notebooks, or a class: one such folder per student")
    grade.add_argument("--json", help="write Gradescope's results.json here")
    grade.add_argument("--tests", default=None, help="graded tests folder (default: tests/grading)")
    grade.add_argument("--timeout", type=float, default=60.0, help="seconds per test (default 60)")
    grade.add_argument("--student-timeout", type=float, default=None, metavar="SECONDS",
                       help="seconds for one student's whole grading, after which their remaining tests fail "
                            f"(default: 5 x --timeout, at least 120: {student_limit(60.0):g} at the default)")
    grade.add_argument("--quiet", action="store_true", help="one student: scores only, without the failed "
                       "tests' messages")
    grade.add_argument("--autograder", metavar="OUT.zip", help="write a Gradescope autograder bundle instead")
    grade.add_argument("--jobs", type=int, default=1, help="a class: students graded at once (default 1)")
    grade.add_argument("--csv", metavar="GRADEBOOK.csv", help="a class: write the gradebook here")
    grade.add_argument("--json-dir", metavar="DIR", help="a class: write DIR/<student>.json, Gradescope's results")
    grade.set_defaults(run=_grade)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not (args.command == "demo" and args.name == "parallel"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra  # handed on to ag.parallel.main
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
