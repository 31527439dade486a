"""The red team at the intake station: uploads whose exercise files are links, hard links, FIFOs
or bad notebooks, graded for real (as root in CI: the sandbox, the worker users, the namespaces).

Hole 1 of issue 48: the judge read the student's folder as root, following links: to solutions/,
a classmate's files, /etc/shadow, the grader's /proc/self/environ, a hidden test, /proc/self/fd/N,
a file whose read blocks (/proc/kmsg, a FIFO), 400 links to one big notebook, a hard link, a link
through /proc/self/cwd in Gradescope's layout, a symlinked enclosing folder. Each submission starts
from solutions/ (full marks), so only the attack can cost points: the attacked exercise scores 0,
every other one full marks, no marker of a linked target appears in any output, and nothing is
left behind. A few gradings carry several attacks each (one grading takes 10-20 s), and each
attack is asserted on its own.
"""
from __future__ import annotations

import csv
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ag import course
from ag.course import batch, extract, intake

from test_redteam import hidden_lines, strings_in  # tests/ is on sys.path under pytest

REPO = course.REPO
SOLUTIONS = REPO / "solutions"
HIDDEN_TEST = REPO / "tests" / "grading" / "hidden" / "test_hidden_ex3.py"
EX = {e.number: e for e in course.EXERCISES}
TIMEOUT = 60  # the grader's default --timeout per test: no attack here is about time, and CI is shared
DEADLINE = 300  # one grading, however hostile
IS_ROOT = os.geteuid() == 0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * DEADLINE + 60),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="links into /proc are Linux's")]


@dataclass
class Graded:
    """One grading: what it printed and wrote, and what the upload's attacks were after."""

    rc: int
    outputs: dict[str, str] = field(repr=False)  # where -> text: the CLI's stdout and stderr, results, gradebook
    results: dict[str, dict] = field(repr=False)  # student -> results.json
    seconds: float
    tmp: Path  # the grader's TMPDIR
    token: str = field(repr=False)  # the TA's secret in the grader's environment
    # what the linked targets hold, that must appear nowhere; never printed (/etc/shadow's hashes)
    markers: dict[str, str] = field(default_factory=dict, repr=False)
    reports: dict = field(default_factory=dict, repr=False)  # a class: student -> Report

    def exercise_scores(self, student: str = "") -> dict[int, tuple[float, float, set[str]]]:
        """Exercise number -> (score, max score, statuses) in the student's results."""
        scores: dict[int, tuple[float, float, set[str]]] = {}
        for test in self.results[student]["tests"]:
            number = next(e.number for e in course.EXERCISES if test["name"].startswith(e.module_name))
            score, top, statuses = scores.get(number, (0.0, 0.0, set()))
            scores[number] = (score + test["score"], top + test["max_score"], statuses | {test["status"]})
        return scores

    def outputs_of(self, number: int, student: str = "") -> str:
        return "\n".join(t["output"] for t in self.results[student]["tests"] if t["name"].startswith(EX[number].module_name))


def shadow_lines() -> dict[str, str]:
    try:
        lines = Path("/etc/shadow").read_text().splitlines()
    except OSError:
        return {}
    return {f"line {i} of /etc/shadow": line for i, line in enumerate(lines, 1) if len(line) >= 12}


def solutions_into(folder: Path, *, skip=(), marker: str = "") -> Path:
    folder.mkdir(parents=True)
    for e in course.EXERCISES:
        if e.number not in skip:
            (folder / e.filename).write_text((SOLUTIONS / e.filename).read_text() + (f"# {marker}\n" if marker else ""))
    return folder


def notebook(path: Path, *sources) -> Path:
    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": s}
             for s in sources]
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}))
    return path


def solution_source(number: int) -> str:
    return (SOLUTIONS / EX[number].filename).read_text().split('if __name__ == "__main__":')[0]


def grader_env(tmp: Path, token: str) -> dict[str, str]:
    tmp.mkdir()
    return {**os.environ, "TMPDIR": str(tmp), "TA_API_TOKEN": token}


def grade_cli(upload: Path, root: Path, *, cwd: Path) -> Graded:
    """``python -m ag grade UPLOAD --json`` with a TA's token in its environment and a TMPDIR of its own."""
    token = f"ta-{secrets.token_hex(12)}"
    results = root / "out" / "results.json"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ag", "grade", str(upload), "--json", str(results),
                           "--timeout", str(TIMEOUT)], capture_output=True, text=True, timeout=DEADLINE,
                          cwd=cwd, env=grader_env(root / "tmp", token))
    graded = Graded(done.returncode, {"stdout": done.stdout, "stderr": done.stderr}, {}, time.perf_counter() - started,
                    root / "tmp", token)
    if results.exists():
        graded.outputs["results.json"] = results.read_text()
        graded.results[""] = json.loads(graded.outputs["results.json"])
    return graded


def full_and_zero(graded: Graded, attacked: set[int], student: str = "") -> list[str]:
    """The problems: an attacked exercise that scored, or another exercise short of full marks."""
    problems = []
    scores = graded.exercise_scores(student)
    for number in EX:
        score, top, statuses = scores.get(number, (None, None, set()))
        if top is None:
            problems.append(f"ex{number} is missing from the results")
        elif number in attacked and (score != 0 or statuses != {"failed"}):
            problems.append(f"the attack on ex{number} scored {score}/{top}")
        elif number not in attacked and (score != top or statuses != {"passed"}):
            problems.append(f"ex{number}, untouched, scored {score}/{top}:\n{graded.outputs_of(number, student)[-600:]}")
    return problems


def leaks(graded: Graded) -> list[str]:
    markers = {"the TA's token": graded.token, **graded.markers,
               **{f"a hidden test's line {line[:30]!r}": line for line in hidden_lines()}}
    texts = dict(graded.outputs)
    for student, results in graded.results.items():
        texts[f"{student or 'the'} results' strings"] = "\n".join(strings_in(results))
    return [f"{label} in {where}" for where, text in texts.items() for label, marker in markers.items()
            if marker in text]


def leftovers(graded: Graded) -> list[str]:
    left = [f"{p.name} in the grader's TMPDIR" for p in graded.tmp.iterdir()]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if graded.token.encode() in Path(f"/proc/{pid}/environ").read_bytes() and int(pid) != os.getpid():
                left.append(f"process {pid} still runs with the grader's environment")
        except OSError:
            pass
    return left


# ---- one upload, files at its top: links to solutions/, a hidden test, /proc/self/environ, /etc/shadow ----

@pytest.fixture(scope="module")
def linked(tmp_path_factory) -> Graded:
    root = tmp_path_factory.mktemp("linked")
    up = solutions_into(root / "up", skip={1, 3, 4, 6, 7})
    (up / EX[1].filename).symlink_to(SOLUTIONS / EX[1].filename)
    (up / EX[3].filename).symlink_to(HIDDEN_TEST)
    (up / EX[4].filename).symlink_to("/proc/self/environ")
    (up / EX[6].filename).symlink_to("/etc/shadow")
    big = notebook(root / "big.ipynb", solution_source(7), "padding = '" + "x" * (2 << 20) + "'\n")
    for i in range(400):  # ex7 is missing: each link would bring its solution back
        (up / f"copy{i:03}.ipynb").symlink_to(big)
    graded = grade_cli(up, root, cwd=root)
    graded.markers = shadow_lines()
    return graded


def test_the_linked_upload_is_graded_and_its_untouched_exercises_keep_full_marks(linked):
    assert linked.rc == 0 and "" in linked.results, linked.outputs["stderr"][-2000:]
    assert full_and_zero(linked, {1, 3, 4, 6, 7}) == []


@pytest.mark.parametrize("number, target", [(1, "solutions/"), (3, "a hidden test"),
                                            (4, "/proc/self/environ"), (6, "/etc/shadow")])
def test_an_exercise_file_linked_elsewhere_scores_zero_and_is_named_as_a_link(linked, number, target):
    score, top, _ = linked.exercise_scores()[number]
    assert score == 0 < top, f"the link to {target} scored"
    assert f"skipped: {EX[number].filename}: not graded, a link" in linked.outputs["stderr"]
    assert f"{EX[number].filename}: not graded, a link" in linked.results[""]["output"]


def test_no_marker_of_a_linked_target_reaches_any_output(linked):
    assert linked.markers or not IS_ROOT, "as root /etc/shadow has lines to look for"
    assert leaks(linked) == []


def test_400_links_to_a_notebook_holding_a_solution_give_nothing(linked):
    assert linked.exercise_scores()[7][0] == 0
    assert "copy000.ipynb: not graded, a link" in linked.outputs["stderr"]


def test_a_missing_exercise_file_is_named_without_an_internal_path(linked):
    assert f"no {EX[7].filename} in your submission" in linked.outputs_of(7)
    assert "/tmp/sandbox" not in linked.outputs["results.json"] + linked.outputs["stdout"]


def test_the_linked_upload_leaves_nothing_behind(linked):
    assert leftovers(linked) == []


# ---- a class: a hard link and a link to a classmate's files, /proc/kmsg, /proc/self/fd/N, a FIFO ----

@pytest.fixture(scope="module")
def classmates(tmp_path_factory) -> Graded:
    root = tmp_path_factory.mktemp("class")
    token, marker = f"ta-{secrets.token_hex(12)}", f"alice-{secrets.token_hex(8)}"
    alice = solutions_into(root / "class" / "alice", marker=marker)
    mallory = solutions_into(root / "class" / "mallory", skip={1, 2, 4, 5, 7})
    # a hard link names one file twice, and both names are refused: to a copy of alice's work outside the
    # class (between two uploads it would cost both, but only someone who can write the class folder makes one)
    backup = root / "backup" / EX[1].filename
    backup.parent.mkdir()
    shutil.copy(alice / EX[1].filename, backup)
    os.link(backup, mallory / EX[1].filename)
    (mallory / EX[2].filename).symlink_to(Path("..") / "alice" / EX[2].filename)
    (mallory / EX[4].filename).symlink_to("/proc/kmsg")  # a read that blocks, as root
    (mallory / EX[5].filename).symlink_to("/proc/self/fd/3")
    os.mkfifo(mallory / EX[7].filename)
    (root / "class" / "eve").mkdir()
    (root / "class" / "eve" / "homework").symlink_to(alice, target_is_directory=True)
    (root / "class" / "zed").symlink_to(alice, target_is_directory=True)
    env = grader_env(root / "tmp", token)
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "TA_API_TOKEN")}
    os.environ.update(TMPDIR=env["TMPDIR"], TA_API_TOKEN=token)
    tempfile.tempdir = None  # read TMPDIR again
    started = time.perf_counter()
    try:
        reports = batch.grade_class(root / "class", jobs=1, timeout=TIMEOUT, csv_path=root / "book.csv",
                                    json_dir=root / "results", progress=False)
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        tempfile.tempdir = None
    outputs = {"gradebook": (root / "book.csv").read_text()}
    results = {}
    for student, report in reports.items():
        if report.graded:  # a student not graded gets no results file
            outputs[f"{student}.json"] = (root / "results" / f"{student}.json").read_text()
            results[student] = json.loads(outputs[f"{student}.json"])
    graded_reports = reports
    graded = Graded(0, outputs, results, time.perf_counter() - started, root / "tmp", token)
    graded.markers = {"alice's marker": marker, **shadow_lines()}
    graded.reports = graded_reports
    return graded


def test_a_classmate_with_every_solution_keeps_full_marks(classmates):
    assert full_and_zero(classmates, set(), "alice") == []


def test_links_and_hard_links_to_a_classmate_blocking_reads_and_a_fifo_score_zero(classmates):
    assert full_and_zero(classmates, {1, 2, 4, 5, 7}, "mallory") == []
    notes = classmates.results["mallory"]["output"]
    for number, what in ((1, "hard links"), (2, "a link"), (4, "a link"), (5, "a link"), (7, "not a regular file")):
        assert f"{EX[number].filename}: not graded, " in notes and what in notes


def test_a_blocking_read_does_not_hold_up_the_class(classmates):
    assert classmates.seconds < DEADLINE


def test_a_symlinked_enclosing_folder_gives_nothing(classmates):
    assert classmates.results["eve"]["score"] == 0
    assert f"homework: not graded, a link" in classmates.results["eve"]["output"]


def test_a_student_folder_that_is_a_link_is_not_graded_and_says_why(classmates):
    assert not classmates.reports["zed"].graded and "zed" not in classmates.results
    (row,) = [r for r in csv.reader(io.StringIO(classmates.outputs["gradebook"])) if r[0] == "zed"]
    assert row[1:len(EX) + 2] == [""] * (len(EX) + 1)  # no points, not 0 points
    assert "not graded: NotADirectoryError: zed is a link, not a student's folder" in row[-1]


def test_no_classmate_marker_reaches_the_gradebook_or_results(classmates):
    assert leaks(classmates) == []


def test_the_class_leaves_nothing_behind(classmates):
    assert leftovers(classmates) == []


# ---- one upload zipped in a folder: bad notebooks, a good one, a /proc/self/cwd link, a hard link ----

@pytest.fixture(scope="module")
def zipped(tmp_path_factory) -> Graded:
    root = tmp_path_factory.mktemp("zipped")
    hw = solutions_into(root / "up" / "homework", skip={3, 5, 6})
    notebook(hw / "a_good.ipynb", solution_source(3), "raise RuntimeError('the demo cell ran')\n")
    notebook(hw / "list_source.ipynb", [1, 2, 3])
    (hw / "cells.ipynb").write_text(json.dumps({"nbformat": 4, "cells": ["def merge_softmax_blocks(a, b): ..."]}))
    (hw / "deep.ipynb").write_text("[" * 100_000 + "]" * 100_000)
    (hw / "broken.ipynb").write_text("{")
    (hw / "x.ipynb").mkdir()
    # Gradescope runs from /autograder/source: a link through the grader's cwd reaches ag's own solution
    (hw / EX[6].filename).symlink_to(f"/proc/self/cwd/solutions/{EX[6].filename}")
    try:
        os.link("/etc/shadow", hw / EX[5].filename)
    except OSError:  # another file system: a hard link to a hidden test then
        shutil.copy(HIDDEN_TEST, root / "hidden.py")
        os.link(root / "hidden.py", hw / EX[5].filename)
    try:
        graded = grade_cli(root / "up", root, cwd=REPO)
    finally:
        (hw / EX[5].filename).unlink()
    graded.markers = shadow_lines()
    return graded


def test_a_zipped_folder_upload_is_graded_as_one_student_with_json(zipped):
    assert zipped.rc == 0 and "" in zipped.results, zipped.outputs["stderr"][-2000:]
    assert full_and_zero(zipped, {5, 6}) == []


def test_bad_notebooks_cost_only_their_own_exercises_and_say_which_file(zipped):
    stderr = zipped.outputs["stderr"]
    for name in ("list_source.ipynb", "cells.ipynb", "deep.ipynb", "broken.ipynb", "x.ipynb"):
        assert f"skipped: {name}" in stderr
    assert "Traceback" not in stderr and zipped.exercise_scores()[3][0] == zipped.exercise_scores()[3][1] > 0


def test_a_link_through_the_graders_cwd_and_a_hard_link_score_zero(zipped):
    assert f"{EX[6].filename}: not graded, a link" in zipped.outputs["stderr"]
    assert f"{EX[5].filename}: not graded, a file with other hard links" in zipped.outputs["stderr"]
    assert leaks(zipped) == []


def test_the_zipped_upload_leaves_nothing_behind(zipped):
    assert leftovers(zipped) == []


# ---- notebooks that cost the grader's own process time or memory (the intake runs as root, before any cap) ----

def taken_in_memory(up: Path, dest: Path) -> tuple:
    """The intake of ``up`` and the most memory it held at once, in bytes."""
    tracemalloc.start()
    try:
        taken = intake.take(up, dest)
        return taken, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.timeout(120)
def test_a_notebook_of_20000_one_line_imports_is_taken_in_seconds(tmp_path):
    """Each definition's source was cut out by ast.get_source_segment, which splits the whole cell
    at every call: 5,000 one-line imports (50 KB) held the grader a minute and a half, outside any limit."""
    up = solutions_into(tmp_path / "up", skip={3})
    notebook(up / "imports.ipynb", "import os\n" * 20_000 + solution_source(3))
    started = time.monotonic()
    taken = intake.take(up, tmp_path / "copy")
    assert time.monotonic() - started < 20
    assert taken.files == sorted(e.filename for e in course.EXERCISES) and taken.notes == []


def test_a_notebook_whose_code_would_take_gigabytes_to_parse_costs_only_its_exercises(tmp_path):
    """1 MB of ``x = (a, a, ...)`` is a million nodes: the parser took some 750 MB for it (16 MB: 12 GB)."""
    up = solutions_into(tmp_path / "up", skip={3})
    notebook(up / "tuple.ipynb", solution_source(3), "x = (" + "a, " * 350_000 + ")\n")
    taken, peak = taken_in_memory(up, tmp_path / "copy")
    assert peak < 64 << 20, f"the intake held {peak:,} bytes at its peak: it parsed the notebook"
    assert taken.notes == [f"tuple.ipynb: not read, an upload's notebooks may hold {extract.MAX_CODE // 1024} KB of "
                           "code in all, the most the grader parses (put data in files, not in cells); its exercises "
                           "are not graded"]
    assert EX[3].filename not in taken.files and len(taken.files) == len(course.EXERCISES) - 1


def test_many_notebooks_under_the_code_cap_each_are_not_all_parsed(tmp_path):
    """The cap is the upload's, not each notebook's: 30 notebooks of 200 KB of code each took half a minute."""
    up = solutions_into(tmp_path / "up", skip={3})
    notebook(up / "a_ex3.ipynb", solution_source(3))
    for i in range(30):
        notebook(up / f"n{i:03}.ipynb", "x = (" + "a, " * 70_000 + ")\n")
    started = time.monotonic()
    taken = intake.take(up, tmp_path / "copy")
    assert time.monotonic() - started < 10
    assert taken.files == sorted(e.filename for e in course.EXERCISES)
    assert taken.notes[0] == "n000.ipynb: nothing taken, it does not define all the functions of any exercise"
    assert taken.notes[1].startswith("n001.ipynb: not read, an upload's notebooks may hold 256 KB of code in all")


def test_a_notebook_of_five_million_empty_objects_is_not_read(tmp_path):
    """15 MB of ``{}`` (under the 16 MB a notebook may have) took 450 MB as parsed JSON, as root."""
    up = solutions_into(tmp_path / "up")
    (up / "braces.ipynb").write_bytes(b'{"nbformat": 4, "cells": [], "metadata": {"x": [' + b"{}," * 5_000_000 + b"{}]}}")
    taken, peak = taken_in_memory(up, tmp_path / "copy")
    assert peak < 64 << 20, f"the intake held {peak:,} bytes at its peak: it parsed the notebook"
    assert taken.notes == [f"braces.ipynb: not read, it opens more than {extract.MAX_CONTAINERS:,} JSON objects and "
                           "arrays (a notebook's cells and outputs need far fewer); its exercises are not graded"]
    assert taken.files == sorted(e.filename for e in course.EXERCISES)
