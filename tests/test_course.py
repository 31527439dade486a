"""The course kit: generated exercises, the grader, and the Gradescope bundle."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest

from ag import course, remat

REPO = Path(__file__).resolve().parent.parent
GRADED_POINTS = 78


def run_ag(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "ag", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_exercises_and_solutions_are_in_sync_with_the_marked_source():
    assert course.assign(check=True) == []


def test_generation_is_idempotent(tmp_path):
    assert len(course.assign(tmp_path)) == 2 * len(course.EXERCISES)
    first = {p.name: p.read_text() for p in tmp_path.rglob("*.py")}
    assert course.assign(tmp_path) == []
    assert {p.name: p.read_text() for p in tmp_path.rglob("*.py")} == first


def test_a_marked_region_becomes_the_stub_at_its_indent():
    source = ("def f(x):\n    y = 1\n    if x:\n        ### BEGIN SOLUTION\n        y = x * 2\n"
              "        ### END SOLUTION\n    return y\n")
    assert course.cut_solutions(source, keep=False) == (
        "def f(x):\n    y = 1\n    if x:\n        # YOUR CODE HERE\n        raise NotImplementedError()\n"
        "    return y\n")
    assert course.cut_solutions(source, keep=True) == (
        "def f(x):\n    y = 1\n    if x:\n        y = x * 2\n    return y\n")


def test_unbalanced_markers_are_reported():
    with pytest.raises(ValueError, match="never closed"):
        course.cut_solutions("### BEGIN SOLUTION\nx = 1\n", keep=False)
    with pytest.raises(ValueError, match="without"):
        course.cut_solutions("x = 1\n### END SOLUTION\n", keep=False)


@pytest.mark.parametrize("exercise", course.EXERCISES, ids=lambda e: e.name)
def test_each_solution_prints_what_its_statement_promises(exercise):
    result = subprocess.run([sys.executable, str(REPO / "solutions" / exercise.filename)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == exercise.expected


# (exercise, what the solution says, what a wrong solution says instead): each fails a graded test
WRONG_SOLUTIONS = {
    "grad_never_freed": (1, "        node.grad = None\n", "        pass\n"),
    "grad_overwritten_instead_of_added": (1, "        tensor.grad += grad", "        tensor.grad = grad"),
    "retain_grad_ignored": (1, "node.is_leaf or node._retains_grad or", "node.is_leaf or"),
    "value_never_discarded": (2, "        tensor.value = None\n", "        pass\n"),
    "first_block_returned": (3, "    m = np.maximum(a.m, b.m)\n", "    return a\n"),
    "float32_accumulator": (4, "acc = np.zeros(q_i.shape[:-1] + vg.shape[-1:], dtype=dtype)",
                            "acc = np.zeros(q_i.shape[:-1] + vg.shape[-1:], dtype=np.float32)"),
    "float32_probabilities": (5, "p = tiles.exp(s)\n", "p = tiles.exp(s).astype(np.float32)\n"),
}


@pytest.mark.parametrize("wrong", sorted(WRONG_SOLUTIONS))
def test_each_self_check_is_as_strict_as_the_grader_and_rejects_a_wrong_solution(wrong, tmp_path):
    number, right, instead = WRONG_SOLUTIONS[wrong]
    exercise = next(e for e in course.EXERCISES if e.number == number)
    text = (REPO / "solutions" / exercise.filename).read_text()
    assert text.count(right) == 1, f"the solution of exercise {number} no longer says {right!r}"
    (tmp_path / exercise.filename).write_text(text.replace(right, instead))
    result = subprocess.run([sys.executable, str(tmp_path / exercise.filename)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0 or result.stdout.strip() != exercise.expected, (
        f"{wrong}: the self-check of exercise {number} prints what it promises for a wrong solution")


def test_the_long_chain_optimum_the_graded_test_expects_is_the_dynamic_programs():
    spec = importlib.util.spec_from_file_location("graded_ex6", REPO / "tests" / "grading" / "test_ex6_checkpoint_plan.py")
    graded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(graded)
    profile = graded.long_chain()
    got = [remat.predict(profile, remat.plan(40, "optimal", chain=profile, budget_bytes=b)).recompute_flops
           for b in graded.LONG_BUDGETS]
    assert tuple(got) == graded.LONG_OPTIMUM




def test_a_package_that_stubs_exercise_4_or_5_holds_none_of_the_labs_flash_loops(tmp_path):
    """The lab's fixed-shift forward and base-2 backward solve exercises 4 and 5 another way: a handout or
    a worker that stubs either gets functions that refuse, and ag still imports with them; the TA's keeps them."""
    from ag.course.assign import package_files
    name = "ag/lab/flash_loops.py"
    assert package_files(set())[name] == (Path(course.__file__).parents[1] / "lab" / "flash_loops.py").read_bytes()
    for stub in ({4}, {5}, {4, 5, 1}):
        files = package_files(stub)
        assert b"matmul" not in files[name] and b"for k_start" not in files[name], stub
    assert package_files({1})[name] == package_files(set())[name]
    for name, data in package_files({5}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    code = ("import ag, ag.lab.flash_loops as loops\n"
            "try:\n    loops.base2_backward(None)\nexcept NotImplementedError as error:\n    print(error)")
    run = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); {code}"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "exercises 4 and 5" in run.stdout


@pytest.mark.parametrize("exercise", course.EXERCISES, ids=lambda e: e.name)
def test_each_untouched_exercise_stops_at_a_stub(exercise):
    result = subprocess.run([sys.executable, str(REPO / "exercises" / exercise.filename)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "NotImplementedError" in result.stderr


def test_the_solutions_score_full_marks_and_the_results_validate(tmp_path):
    result = run_ag("grade", "solutions", "--json", str(tmp_path / "results.json"))
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    jsonschema.validate(results, course.RESULTS_SCHEMA)
    assert results["score"] == results["max_score"] == GRADED_POINTS
    assert all(t["status"] == "passed" for t in results["tests"])
    assert {t["visibility"] for t in results["tests"]} == {"visible", "after_published"}


def test_every_graded_test_fails_on_the_untouched_exercises():
    report = course.grade(REPO / "exercises")
    assert report.max_score == GRADED_POINTS and report.score == 0
    assert all(t.status == "failed" and "NotImplementedError" in t.output for t in report.tests)


def test_a_submission_that_hangs_crashes_exits_or_floods_loses_only_those_tests(tmp_path):
    shutil.copytree(REPO / "solutions", tmp_path / "s")
    sabotage = {
        "ex3_online_softmax.py": ("def merge_softmax_blocks(", "    while True:\n        pass\n"),
        "ex4_flash_forward.py": ("def tiled_forward(tiles", "    import sys\n    sys.exit(3)\n"),
        "ex5_flash_backward.py": ("def tiled_backward(tiles", "    import os\n    os._exit(1)\n"),
        "ex6_checkpoint_plan.py": ("def plan(n_layers", "    print('x' * 5_000_000)\n    raise RuntimeError('boom')\n"),
    }
    for name, (signature, body) in sabotage.items():
        path = tmp_path / "s" / name
        lines = path.read_text().splitlines(keepends=True)
        start = next(i for i, line in enumerate(lines) if line.startswith(signature))
        end = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith(":"))
        lines.insert(end + 1, body)
        path.write_text("".join(lines))
    report = course.grade(tmp_path / "s", timeout=10)  # ex1 passes at 4 s with two CPU hogs beside it
    by_exercise = {}
    for t in report.tests:
        by_exercise.setdefault(t.exercise.split("_")[0], []).append(t)
    for ex, status in (("ex1", "passed"), ("ex2", "passed"), ("ex3", "failed"), ("ex4", "failed"),
                       ("ex5", "failed"), ("ex6", "failed"), ("ex7", "passed"), ("ex8", "passed")):
        for t in by_exercise[ex]:
            assert t.status == status, f"{t.name}: {t.status}\n{t.output[-2000:]}"
    assert report.score == sum(t.max_score for ex in ("ex1", "ex2", "ex7", "ex8") for t in by_exercise[ex])
    assert any("timed out" in t.output for t in by_exercise["ex3"])
    assert all(len(t.output) <= 12_000 for t in report.tests)


def test_the_autograder_bundle_holds_what_gradescope_runs(tmp_path):
    result = run_ag("grade", "--autograder", str(tmp_path / "autograder.zip"))
    assert result.returncode == 0, result.stderr
    with zipfile.ZipFile(tmp_path / "autograder.zip") as bundle:
        names = set(bundle.namelist())
        assert {"setup.sh", "run_autograder", "ag-src/pyproject.toml", "ag-src/ag/course/grade.py",
                "tests/grading/conftest.py", "tests/grading/hidden/test_hidden_ex3.py",
                "tests/grading/references/__init__.py", "tests/grading/hidden/judge_references.py"} <= names
        assert (bundle.getinfo("run_autograder").external_attr >> 16) & 0o111
        assert b"ag grade /autograder/submission" in bundle.read("run_autograder")


def test_assign_check_fails_when_an_exercise_was_edited_by_hand(tmp_path):
    course.assign(tmp_path)
    (tmp_path / "exercises" / course.EXERCISES[0].filename).write_text("# edited\n")
    assert course.assign(tmp_path, check=True) == [tmp_path / "exercises" / course.EXERCISES[0].filename]


@pytest.mark.skipif(os.geteuid() != 0, reason="the namespace check runs only when grading as root")
def test_as_root_without_namespaces_nothing_is_graded_and_no_results_are_written(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "unshare").write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    (fake / "unshare").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "ag", "grade", "solutions", "--json", str(tmp_path / "r.json")],
                            capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert result.returncode == 3
    assert "cannot make the worker's namespaces" in result.stderr and "Operation not permitted" in result.stderr
    assert not (tmp_path / "r.json").exists()
