"""Grading a class: notebooks turned into exercise files, students in parallel, gradebook and results."""
import csv
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import threading

import jsonschema
import pytest

from ag import course
from ag.course import batch, extract, intake

REPO = course.REPO
EX3 = next(e for e in course.EXERCISES if e.number == 3)
EXERCISE_COLUMNS = [e.module_name for e in course.EXERCISES]


def code_cell(source: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
            "source": source.splitlines(keepends=True)}


def write_notebook(path, *sources: str):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# Exercise 3"]}, *map(code_cell, sources)]
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}))
    return path


def ex3_notebook(path):
    """The solution of exercise 3 in a notebook, then a %timeit magic and a demo cell that raises."""
    solution = (REPO / "solutions" / EX3.filename).read_text().split('if __name__ == "__main__":')[0]
    return write_notebook(path, solution, "%timeit merge_softmax_blocks(a, b)\n!ls\nmerge_softmax_blocks?\n",
                          "a = b = None\nraise RuntimeError('the demo cell ran at import')\n")


def import_file(path):
    spec = importlib.util.spec_from_file_location(f"extracted_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_exercises(source, folder, *, skip=()):
    folder.mkdir(parents=True)
    for file in sorted(source.glob("ex*.py")):
        if file.name not in skip:
            shutil.copy(file, folder)
    return folder


def read_gradebook(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], {row[0]: dict(zip(rows[0], row)) for row in rows[1:]}


def max_points_by_exercise(report):
    points = dict.fromkeys(EXERCISE_COLUMNS, 0.0)
    for test in report.tests:
        points[test.exercise] += test.max_score
    return points


# ---- notebooks ----

def extracted(notebook, dest):
    """The exercise files the notebook gives, written into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    files = extract.exercise_files(notebook.name, notebook.read_bytes())
    for name, source in files.items():
        (dest / name).write_text(source)
    return [dest / name for name in files]


def test_a_notebook_gives_its_functions_and_never_runs_its_demo_cells(tmp_path):
    written = extracted(ex3_notebook(tmp_path / "homework.ipynb"), tmp_path / "out")
    assert written == [tmp_path / "out" / EX3.filename]
    module = import_file(written[0])  # the demo cell would raise
    assert callable(module.merge_softmax_blocks)
    assert "timeit" not in written[0].read_text() and "RuntimeError" not in written[0].read_text()


def test_a_magic_inside_a_function_becomes_pass(tmp_path):
    notebook = write_notebook(tmp_path / "nb.ipynb", "def merge_softmax_blocks(a, b):\n    %time x = 1\n"
                              "    return a\n\n%timeit merge_softmax_blocks(1, 2)\n")
    module = import_file(extracted(notebook, tmp_path)[0])
    assert module.merge_softmax_blocks("a", "b") == "a"


def test_a_notebook_writes_only_the_exercises_whose_functions_it_all_defines(tmp_path):
    notebook = write_notebook(tmp_path / "nb.ipynb", "def plan(n, strategy):\n    return []\n",
                              "def merge_softmax_blocks(a, b):\n    return a\n")
    assert [p.name for p in extracted(notebook, tmp_path)] == [EX3.filename]


def test_a_notebook_cell_that_is_not_python_is_a_clear_error(tmp_path):
    notebook = write_notebook(tmp_path / "broken.ipynb", "def merge_softmax_blocks(a, b:\n    return a\n")
    with pytest.raises(extract.NotebookError, match=r"broken\.ipynb.*not Python"):
        extracted(notebook, tmp_path)
    (tmp_path / "text.ipynb").write_text("not json")
    with pytest.raises(extract.NotebookError, match=r"text\.ipynb is not a notebook"):
        extracted(tmp_path / "text.ipynb", tmp_path)


def test_a_py_file_wins_over_a_notebook_for_the_same_exercise(tmp_path):
    student = copy_exercises(REPO / "exercises", tmp_path / "s")
    ex3_notebook(student / "homework.ipynb")
    taken = intake.take(student, tmp_path / "copy")
    assert (taken.folder / EX3.filename).read_text() == (student / EX3.filename).read_text()
    assert taken.notes == []


# ---- a class ----

@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """Three students graded two at a time: solutions, untouched exercises, solutions with ex3 as a notebook."""
    root = tmp_path_factory.mktemp("class")
    copy_exercises(REPO / "solutions", root / "students" / "alice")
    copy_exercises(REPO / "exercises", root / "students" / "bob")
    carol = copy_exercises(REPO / "solutions", root / "students" / "carol", skip={EX3.filename})
    ex3_notebook(carol / "homework.ipynb")
    reports = batch.grade_class(root / "students", jobs=2, csv_path=root / "gradebook.csv",
                                json_dir=root / "results", progress=False)
    header, rows = read_gradebook(root / "gradebook.csv")
    return reports, header, rows, root / "results"


def test_the_gradebook_has_a_column_per_exercise_then_total_and_max_total(graded_class):
    reports, header, rows, _ = graded_class
    assert header[:len(EXERCISE_COLUMNS) + 3] == ["student", *EXERCISE_COLUMNS, "total", "max_total"]
    assert list(rows) == list(reports) == ["alice", "bob", "carol"]


def test_every_graded_test_belongs_to_an_exercise(graded_class):
    reports, *_ = graded_class
    assert all(t.exercise in EXERCISE_COLUMNS for t in reports["alice"].tests)


@pytest.mark.parametrize("student", ["alice", "carol"])
def test_the_solutions_get_full_points_in_every_exercise(graded_class, student):
    reports, _, rows, _ = graded_class
    full = max_points_by_exercise(reports[student])
    assert {c: float(rows[student][c]) for c in EXERCISE_COLUMNS} == full
    assert float(rows[student]["total"]) == float(rows[student]["max_total"]) == sum(full.values()) > 0
    assert rows[student]["error"] == ""


def test_the_untouched_exercises_score_zero(graded_class):
    reports, _, rows, _ = graded_class
    assert reports["bob"].score == 0
    assert all(float(rows["bob"][c]) == 0 for c in [*EXERCISE_COLUMNS, "total"])
    assert float(rows["bob"]["max_total"]) == reports["alice"].max_score


def test_each_student_gets_a_results_json_that_gradescope_accepts(graded_class):
    reports, _, _, results = graded_class
    assert sorted(p.name for p in results.iterdir()) == ["alice.json", "bob.json", "carol.json"]
    for student, report in reports.items():
        data = json.loads((results / f"{student}.json").read_text())
        jsonschema.validate(data, course.RESULTS_SCHEMA)
        assert data["score"] == report.score


class FakeJudge:
    """A judge that grades every student 2/2 on exercise 3, and fails for ben; it records its slots."""

    slots: dict = {}

    def __init__(self, tests=None, *, timeout=60.0, slot=0, hide=(), student_timeout=None):
        self.slot = slot

    def grade(self, submission):
        FakeJudge.slots.setdefault(threading.get_ident(), set()).add(self.slot)
        if submission.name == "ben":
            raise RuntimeError("the sandbox\nbroke")
        return course.Report(tests=[course.TestResult(name=f"{EX3.module_name}: test_x", max_score=2.0,
                                                      score=2.0, status="passed")])

    def stop(self):
        pass

    def close(self):
        pass


def fake_class(tmp_path, monkeypatch):
    for name in ("ann", "ben", "cat", "dan"):
        copy_exercises(REPO / "exercises", tmp_path / "class" / name)
    FakeJudge.slots = {}
    monkeypatch.setattr(batch, "Judge", FakeJudge)
    return tmp_path / "class"


def test_a_student_whose_grading_fails_is_not_graded_never_zero_and_the_class_goes_on(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    (results / "ben.json").write_text('{"score": 99}')  # a stale file from an earlier run
    reports = batch.grade_class(fake_class(tmp_path, monkeypatch), jobs=2, csv_path=tmp_path / "book.csv",
                                json_dir=results, progress=False)
    _, rows = read_gradebook(tmp_path / "book.csv")
    assert [rows[s]["total"] for s in reports] == ["2", "", "2", "2"]
    assert all(rows["ben"][c] == "" for c in EXERCISE_COLUMNS)
    assert rows["ben"]["max_total"] == "2" and rows["ben"]["error"] == "not graded: RuntimeError: the sandbox broke"
    assert not reports["ben"].graded and sorted(p.name for p in results.iterdir()) == ["ann.json", "cat.json", "dan.json"]
    assert all(len(s) == 1 for s in FakeJudge.slots.values()) and set().union(*FakeJudge.slots.values()) <= {0, 1}


def test_a_class_with_a_student_not_graded_exits_non_zero_and_names_them_with_the_reason(tmp_path, monkeypatch,
                                                                                        capsys):
    from ag import cli
    klass = fake_class(tmp_path, monkeypatch)
    code = cli.main(["grade", str(klass), "--csv", str(tmp_path / "book.csv"), "--tests", str(REPO / "tests" / "grading")])
    out, err = capsys.readouterr()
    assert code == 3 and "not graded: ben: RuntimeError: the sandbox broke" in err
    assert "students: 4, graded: 3" in out and " ben" not in out


def test_a_cell_a_spreadsheet_would_read_as_a_formula_is_neutralised():
    from ag.course.escape import for_csv
    for cell in ("=1+1", "+1", "-1", "@SUM(A1)", "\t=1", "\r=1"):
        assert for_csv(cell).startswith("'")
    assert for_csv("alice") == "alice" and for_csv("=A1\x1b[2J") == "'=A1\\x1b[2J"


def test_control_characters_are_shown_as_escapes_and_newlines_kept_only_when_asked():
    from ag.course.escape import for_terminal
    hostile = "a\x1b[2Jb\rc\x07d\x9be\u202ef\u2066g\nh\ti"
    assert for_terminal(hostile) == "a\\x1b[2Jb\\x0dc\\x07d\\x9be\\u202ef\\u2066g\\x0ah\\x09i"
    assert for_terminal(hostile, lines=True).endswith("g\nh\ti")
    assert for_terminal("exercise 3: ö, 日本") == "exercise 3: ö, 日本"


def test_a_result_file_is_written_whole_and_a_link_in_its_place_is_refused(tmp_path):
    from ag.course.writing import UnsafeTarget, write_new
    target = write_new(tmp_path / "results.json", "{}")
    assert target.read_text() == "{}" and oct(target.stat().st_mode & 0o777) == "0o644"
    write_new(target, "[]")
    assert target.read_text() == "[]" and [p.name for p in tmp_path.iterdir()] == ["results.json"]
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (tmp_path / "link.json").symlink_to(victim)
    with pytest.raises(UnsafeTarget, match=r"link\.json is a symbolic link .*victim"):
        write_new(tmp_path / "link.json", "{}")
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(UnsafeTarget, match="not a regular file"):
        write_new(tmp_path / "folder.json", "{}")
    assert victim.read_text() == "mine" and (tmp_path / "link.json").is_symlink()


def test_progress_off_a_terminal_prints_a_line_every_tenth_of_the_class():
    stream = io.StringIO()
    bar = batch.Progress(20, stream=stream)
    for _ in range(20):
        bar.advance()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10 and lines[-1].startswith("grading [####################] 20/20 students")


# ---- the command line ----

def test_ag_grade_on_a_class_folder_writes_the_gradebook_and_results(tmp_path):
    tests = shutil.copytree(REPO / "tests" / "grading", tmp_path / "grading",
                            ignore=shutil.ignore_patterns("__pycache__"))
    for other in [*tests.glob("test_ex*.py"), *tests.glob("hidden/test_hidden_ex*.py")]:  # only exercise 3's graded
        if other.stem not in (f"test_{EX3.module_name}", f"test_hidden_ex{EX3.number}"):  # tests, to keep it short
            other.unlink()
    copy_exercises(REPO / "solutions", tmp_path / "class" / "alice")
    copy_exercises(REPO / "exercises", tmp_path / "class" / "bob")
    result = subprocess.run([sys.executable, "-m", "ag", "grade", str(tmp_path / "class"), "--jobs", "2",
                             "--tests", str(tests), "--csv", str(tmp_path / "book.csv"),
                             "--json-dir", str(tmp_path / "results")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "students: 2" in result.stdout
    _, rows = read_gradebook(tmp_path / "book.csv")
    assert rows["alice"]["total"] == rows["alice"]["max_total"] == rows["alice"][EX3.module_name] != "0"
    assert rows["bob"]["total"] == "0"
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["alice.json", "bob.json"]


def test_hidden_folders_and_the_results_folder_are_no_students_and_the_ta_is_told(tmp_path, capsys):
    for name in ("alice", "bob", ".git", "__MACOSX", "results", ".\x1b[2Jeve"):
        (tmp_path / name).mkdir()
    (tmp_path / "notes.txt").write_text("not a student")
    students = batch.student_folders(tmp_path, results=tmp_path / "results")
    assert list(students) == ["alice", "bob"]
    err = capsys.readouterr().err
    assert all(f"{name} left out" in err for name in (".git", "__MACOSX", "results", ".\\x1b[2Jeve"))
    assert "\x1b" not in err
