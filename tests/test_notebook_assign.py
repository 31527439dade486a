"""`ag assign --format notebook`: nbgrader's source notebooks, graded by the real nbgrader.

In a temporary course directory, `nbgrader generate_assignment` makes the students' release
from each source notebook and `nbgrader autograde` grades two submissions per exercise: the
source itself (full points) and the untouched release (zero). Two exercises run by default,
the other five under `slow`. CI sets AG_REQUIRE_NOTEBOOKS=1 so that a missing nbgrader or
jupytext fails the run instead of skipping it.
"""
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_course import GRADED_POINTS

from ag import course
from ag.course import notebook
from ag.course.checks import code, expect_close, fenced
from ag.course.assign import BEGIN, FORMATS, cut_solutions

REPO = Path(__file__).resolve().parent.parent
QUICK = ("ex3_online_softmax", "ex7_dtr_eviction")  # a hidden test; a graph captured in the kernel
SLOW = tuple(e.module_name for e in course.EXERCISES if e.module_name not in QUICK)


def require(module: str):
    """``module``, or a skip that says how to install it; with AG_REQUIRE_NOTEBOOKS=1 a failure."""
    if importlib.util.find_spec(module) is None and os.environ.get("AG_REQUIRE_NOTEBOOKS") is None:
        pytest.skip(f"needs {module}: pip install -e '.[course]' (CI sets AG_REQUIRE_NOTEBOOKS=1 to make "
                    "this a failure)")
    return importlib.import_module(module)


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def grade_cells(path: Path) -> list[dict]:
    return [c for c in cells(path) if c["metadata"].get("nbgrader", {}).get("grade")]


def test_the_committed_notebooks_are_in_sync_with_the_marked_source():
    require("jupytext")
    assert course.assign(check=True, formats=("notebook",)) == [], "run `ag assign --format notebook`"


def test_notebooks_have_no_outputs_and_the_same_bytes_on_every_run():
    require("jupytext")
    for exercise in course.EXERCISES:
        text = notebook.render_notebook(exercise)
        assert notebook.render_notebook(exercise) == text
        nb = json.loads(text)
        assert all(c.get("outputs", []) == [] and c.get("execution_count") is None for c in nb["cells"])
        assert len({c["id"] for c in nb["cells"]}) == len(nb["cells"])
        assert nb["metadata"]["kernelspec"]["name"] == "python3"


def test_solution_cells_test_cells_and_points_are_marked_as_nbgrader_reads_them():
    require("jupytext")
    total = 0
    for exercise in course.EXERCISES:
        nb = json.loads(notebook.render_notebook(exercise))
        solutions = [c for c in nb["cells"] if c["metadata"]["nbgrader"]["solution"]]
        assert solutions and {c["id"] for c in solutions} <= {f for _, f in exercise.functions}
        for cell in solutions:
            assert BEGIN in source(cell) and cell["metadata"] == {"nbgrader": {
                "solution": True, "grade": False, "locked": False, "grade_id": cell["id"], "schema_version": 3}}
        tests = [c["metadata"]["nbgrader"] for c in nb["cells"] if c["metadata"]["nbgrader"]["grade"]]
        assert tests and all(t["locked"] and not t["solution"] and t["points"] > 0 for t in tests)
        total += sum(t["points"] for t in tests)
        others = [c for c in nb["cells"] if c not in solutions and not c["metadata"]["nbgrader"]["grade"]]
        assert all(c["metadata"]["nbgrader"]["locked"] for c in others)  # read-only
    assert total == GRADED_POINTS  # what `ag grade` gives the solutions


def test_the_notebook_worker_runs_a_probe_on_copies_and_returns_plain_data():
    from ag.attention import merge_softmax_blocks  # the library's own: installing it changes nothing
    run = notebook.worker({"merge_softmax_blocks": merge_softmax_blocks}, "ex3_online_softmax")

    def probe(ex, a):
        a[0] = 99.0
        return ex.merge_softmax_blocks is merge_softmax_blocks, a
    data = np.zeros(2)
    got = run(probe, data)
    assert type(got) is list and got[0] is True and got[1].tolist() == [99.0, 0.0]
    assert data.tolist() == [0.0, 0.0]  # as under the judge, the probe had a copy
    with pytest.raises(NameError, match="defines no merge_softmax_blocks yet"):
        notebook.worker({}, "ex3_online_softmax")


def test_assign_check_reports_a_stale_notebook(tmp_path):
    require("jupytext")
    course.assign(tmp_path, formats=FORMATS)
    stale = tmp_path / notebook.NOTEBOOKS / QUICK[0] / f"{QUICK[0]}.ipynb"
    stale.write_text(stale.read_text().replace("np.maximum(a.m, b.m)", "np.fmax(a.m, b.m)"))  # by hand
    result = subprocess.run([sys.executable, "-m", "ag", "assign", "--check", "--root", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and f"out of sync with its source in ag/: {stale}" in result.stdout
    assert "ag assign --format notebook" in result.stdout
    assert course.assign(tmp_path, check=True, formats=("notebook",)) == [stale]
    assert course.assign(tmp_path, check=True) == []  # the .py files alone are in sync


def nbgrader(course_dir: Path, *args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course_dir, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"


def grade_with_nbgrader(tmp_path: Path, assignments: tuple[str, ...]) -> None:
    """Generate each assignment's release, check it, autograde the source and the release, check the scores."""
    require("jupytext")
    require("nbgrader")
    from nbgrader.api import Gradebook
    course.assign(tmp_path / "generated", formats=("notebook",))
    root = tmp_path / "course"
    for a in assignments:
        shutil.copytree(tmp_path / "generated" / notebook.NOTEBOOKS / a, root / "source" / a)
    (root / "nbgrader_config.py").write_text('c = get_config()\nc.CourseDirectory.course_id = "ag"\n'
                                             "c.Execute.timeout = 300\n")
    nbgrader(root, "generate_assignment", "*", "--force")
    for a in assignments:
        source_nb, release_nb = (root / kind / a / f"{a}.ipynb" for kind in ("source", "release"))
        check_release(source_nb, release_nb)
        for student, path in (("solution", source_nb), ("release", release_nb)):
            (root / "submitted" / student / a).mkdir(parents=True)
            shutil.copy(path, root / "submitted" / student / a / path.name)
        if a == "ex3_online_softmax":  # a wrong answer: the check's own message, as plain text
            (root / "submitted" / "wrong" / a).mkdir(parents=True)
            (root / "submitted" / "wrong" / a / source_nb.name).write_text(
                source_nb.read_text().replace("    m = np.maximum(a.m, b.m)\\n", "    return a\\n", 1))
    nbgrader(root, "autograde", "*", "--force")
    scores = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gradebook:
        for a in assignments:
            points = sum(c["metadata"]["nbgrader"]["points"] for c in grade_cells(root / "source" / a / f"{a}.ipynb"))
            for student in ("solution", "release"):
                submission = gradebook.find_submission(a, student)
                scores[a, student] = (submission.score, submission.max_score)
            assert scores[a, "solution"] == (points, points), a
            assert scores[a, "release"] == (0, points), a
    check_failures(root, assignments)
    if "ex3_online_softmax" in assignments:
        check_wrong_answer(root)
    print("nbgrader scores (score, max):", scores)


def check_wrong_answer(root: Path) -> None:
    """`return a` fails the merge checks with their messages (what, where, expected, got) in plain text."""
    a = "ex3_online_softmax"
    failed = [feedback_errors(c) for c in grade_cells(root / "autograded" / "wrong" / a / f"{a}.ipynb")]
    assert all(failed) and all(e[0]["ename"] == "AssertionError" for e in failed)
    message = failed[0][0]["evalue"]
    assert "o, the merged softmax(s) @ v, where a's max is larger (row 0) differs" in message, message
    assert "at index (0, 0): expected " in message and ", got " in message, message
    for errors in failed:
        expect_plain_feedback(errors[0], root)


def check_release(source_nb: Path, release_nb: Path) -> None:
    """nbgrader's release: each solution region is the stub `ag assign` writes, the hidden tests are gone."""
    release, text = cells(release_nb), release_nb.read_text()
    assert [c["id"] for c in release] == [c["id"] for c in cells(source_nb)]
    for mine, theirs in zip(cells(source_nb), release):
        if mine["metadata"]["nbgrader"]["solution"]:
            assert source(theirs) == cut_solutions(source(mine), keep=False).rstrip("\n")
        if notebook.HIDDEN_BEGIN in source(mine):
            name = mine["metadata"]["nbgrader"]["grade_id"]
            assert name not in source(theirs) and theirs["metadata"]["nbgrader"]["points"] > 0
    assert BEGIN not in text and "### BEGIN HIDDEN TESTS" not in text


def feedback_errors(cell: dict) -> list[dict]:
    return [o for o in cell["outputs"] if o["output_type"] == "error"]


def expect_plain_feedback(error: dict, root: Path) -> None:
    """A failed graded cell's error reads as plain text and names no path of ag or of the course."""
    shown = error["evalue"] + "\n".join(error["traceback"])
    for markdown in ("**", "|---|", "```", "` "):
        assert markdown not in error["evalue"], (markdown, error["evalue"])
    for path in (str(REPO), str(root), str(Path(notebook.__file__).parent)):
        assert path not in shown, (path, shown)


def check_failures(root: Path, assignments: tuple[str, ...]) -> None:
    """The release scored 0 because every graded cell reached a stub, each said so in plain text, and
    the source printed what it promises."""
    for a in assignments:
        exercise = next(e for e in course.EXERCISES if e.module_name == a)
        for cell in grade_cells(root / "autograded" / "release" / a / f"{a}.ipynb"):
            errors = feedback_errors(cell)
            assert [e["ename"] for e in errors] == ["AssertionError"], (cell["id"], errors)
            assert errors[0]["evalue"].startswith("Your code raised NotImplementedError"), errors[0]["evalue"]
            expect_plain_feedback(errors[0], root)
        check = next(c for c in cells(root / "autograded" / "solution" / a / f"{a}.ipynb") if c["id"] == "check")
        assert "".join("".join(o.get("text", [])) for o in check["outputs"]).strip() == exercise.expected


def test_nbgrader_gives_the_source_full_points_and_the_release_zero(tmp_path):
    grade_with_nbgrader(tmp_path, QUICK)


@pytest.mark.slow
def test_nbgrader_grades_the_other_exercises_too(tmp_path):
    grade_with_nbgrader(tmp_path, SLOW)


def test_a_failed_check_reads_as_plain_text_and_a_passing_one_gives_none():
    def wrong(worker):
        expect_close(np.array([1.0, 2.0]), np.array([1.0, 3.0]), what="the `x` grad")

    assert notebook.failure(lambda worker: None, "worker") is None
    assert notebook.failure(wrong, "worker") == (
        "the x grad differs from the reference in 1 of 2 elements (tolerance: atol = 0, rtol = 1e-07).\n\n"
        "at index (1,): expected 3, got 2")
    message = "Your code failed here:\n\n" + fenced("a\n```\nb") + "\n**e\\*** " + code("x ` y")
    assert notebook.plain_text(message) == (
        "Your code failed here:\n\n    a\n    ```\n    b\ne* x ` y")


def test_student_code_that_raises_is_named_with_its_function_and_no_path():
    def merge_softmax_blocks(a, b):
        raise ValueError("shapes differ")

    said = notebook.failure(lambda: merge_softmax_blocks(1, 2))
    assert said.startswith("Your code raised ValueError: shapes differ (in merge_softmax_blocks, line ")
    assert "/" not in said
