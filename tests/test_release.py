"""The student release (nbgrader's split): generated from the marked source, no solution travels."""
import ast
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ag import course, hooks, tensor, trace
from ag.attention.shapes import check_shapes
from ag.attention.tiles import Tiles

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "ag"
BY_NUMBER = {e.number: e for e in course.EXERCISES}
assign = importlib.import_module("ag.course.assign")  # the module; ag.course.assign is the function


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """What students receive, written by `ag assign --release`."""
    dest = tmp_path_factory.mktemp("release")
    result = run([sys.executable, "-m", "ag", "assign", "--release", str(dest)], cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert str(dest) in result.stdout
    return dest


@pytest.fixture(scope="module")
def installed(release, tmp_path_factory):
    """The release as pip installs it (no network, no build isolation)."""
    target = tmp_path_factory.mktemp("site")
    result = run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                  "--disable-pip-version-check", "-q", "--target", str(target), str(release)])
    assert result.returncode == 0, result.stderr
    assert (target / "ag" / "tensor.py").exists()
    return target


def split_source() -> tuple[list[str], list[str], list[str]]:
    """The source package's stripped lines inside marked regions, outside them, and each region's text."""
    outside, regions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        region = None
        for line in path.read_text().splitlines():
            if line.strip() == course.BEGIN:
                region = []
            elif line.strip() == course.END:
                regions.append("\n".join(region))
                region = None
            else:
                (outside if region is None else region).append(line)
    strip = lambda lines: [s for s in (line.strip() for line in lines) if s]  # noqa: E731
    return strip("\n".join(regions).splitlines()), strip(outside), regions


def solution_lines() -> set[str]:
    """Every stripped, non-empty line of a solution region that appears nowhere outside the regions."""
    inside, outside, _ = split_source()
    return set(inside) - set(outside)


def secret_regions() -> list[str]:
    """The regions whose whole text does not also appear outside the regions in the source."""
    _, _, regions = split_source()
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    source = source.replace(course.BEGIN, "").replace(course.END, "")
    return [r for r in regions if r.strip() and source.count(r) == 1]  # once: the region itself


def leaks(files: dict[str, str]) -> tuple[set[str], list[str]]:
    """The solution lines and whole regions found in ``files`` (name to text)."""
    secrets, regions = solution_lines(), secret_regions()
    lines = {line.strip() for text in files.values() for line in text.splitlines()}
    return secrets & lines, [r for r in regions if any(r in text for text in files.values())]


def test_the_release_holds_the_exercises_the_public_graded_tests_and_no_hidden_ones(release):
    for exercise in course.EXERCISES:
        expected = course.render(exercise, solution=False)
        assert (release / "exercises" / exercise.filename).read_text() == expected
    public = {p.relative_to(REPO) for p in (REPO / "tests" / "grading").glob("test_*.py")}
    assert public and all((release / p).read_bytes() == (REPO / p).read_bytes() for p in public)
    assert (release / "tests" / "grading" / "conftest.py").exists()
    assert not (release / "tests" / "grading" / "hidden").exists()
    assert not list(release.rglob("__pycache__")) and not (release / "solutions").exists()
    assert (release / "pyproject.toml").read_bytes() == (REPO / "pyproject.toml").read_bytes()
    readme = (release / "README.md").read_text()
    assert "pip install -e ." in readme and "ag grade exercises --tests tests/grading" in readme


def test_the_release_carries_the_lecture_notes_and_notebooks_the_statements_cite(release):
    for folder in ("lectures", "notebooks"):
        wanted = sorted(p.relative_to(REPO) for p in (REPO / folder).rglob("*") if p.is_file()
                        and "__pycache__" not in p.parts)
        assert wanted, f"the repository has no {folder}/"
        assert sorted(p.relative_to(release) for p in (release / folder).rglob("*") if p.is_file()) == wanted
        assert all((release / p).read_bytes() == (REPO / p).read_bytes() for p in wanted)


def test_student_md_says_how_to_install_check_grade_and_what_to_upload_in_which_layout(release):
    guide = (release / "STUDENT.md").read_text()
    for step in ("pip install -e '.[grade]'", "python exercises/ex3_online_softmax.py",
                 "ag grade exercises --tests tests/grading", "lectures/", "notebooks/"):
        assert step in guide, f"STUDENT.md does not say {step!r}"
    assert all(e.filename in guide for e in course.EXERCISES)
    assert "at the top of the upload" in guide and "one enclosing folder" in guide


def test_each_statement_explains_the_names_it_asks_the_student_to_use():
    ex1, ex4 = (next(e for e in course.EXERCISES if e.number == n).statement for n in (1, 4))
    assert re.search(r"when it is owned \([^)]*nothing else holds", ex1)
    assert re.search(r"copy; once it exists, add into it", ex1)
    assert not re.search(r"hooks|config|watchers|publish", ex1), "exercise 1 teaches the lecture's rule, not the engine's events"
    assert re.search(r"qg, kg, vg are q, k, v viewed by tiles\.grouped as \(\.\.\., h_kv, group, n, d\)", ex4)
    assert re.search(r"tiles\.key_tiles\(q_start, q_stop\) the k_start of each key tile", ex4)


def test_exercise_1s_solution_is_the_lecture_rule_and_the_engine_publishes_the_grad_it_allocates():
    source = inspect.getsource(tensor.accumulate_grad)
    solution = source.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
    assert "grad.copy()" in solution and "+=" in solution
    assert not re.search(r"hooks|config|watchers|publish", solution), solution
    assert "hooks.publish(\"grad allocated\"" in source.split("### END SOLUTION")[1]


@pytest.mark.parametrize("exercise", course.EXERCISES, ids=lambda e: e.name)
def test_every_name_of_ag_a_statement_cites_exists(exercise):
    q = np.zeros((1, 2, 4, 8))
    owners = {"hooks": hooks, "trace": trace, "tiles": Tiles(check_shapes("tiles", q, q, q), False, 1.0, 2, 2)}
    for owner, name in re.findall(r"\b(hooks|trace|tiles)\.([A-Za-z_]\w*)", exercise.statement):
        assert hasattr(owners[owner], name), f"exercise {exercise.number} cites {owner}.{name}, which does not exist"


# lines of Algorithm 1 that the lecture's pseudocode writes as the solution does
TAUGHT = {"m_i = m_new"}


def test_neither_the_release_nor_its_installed_copy_holds_a_line_of_any_solution(release, installed):
    files = {str(p): p.read_text(errors="replace")
             for folder in (release, installed) for p in folder.rglob("*") if p.is_file()
             and p.relative_to(folder).parts[0] != "lectures"}
    assert (installed / "ag" / "_stubbed.py").exists()
    assert (installed / "ag" / "attention" / "kernels" / "flash_fwd.cu").exists()
    assert leaks(files) == (set(), [])


def test_the_lecture_notes_in_the_release_hold_no_solution_beyond_the_algorithms_they_teach(release):
    notes = {str(p): p.read_text() for p in (release / "lectures").rglob("*.md")}
    lines, regions = leaks(notes)
    assert regions == [] and lines <= TAUGHT, f"the lecture notes hold solution lines {sorted(lines - TAUGHT)}"


def test_the_leak_scan_finds_every_solution_in_a_copy_that_keeps_them():
    secrets, regions = solution_lines(), secret_regions()
    assert len(secrets) > 20 and len(regions) >= 8
    kept = {name: data.decode(errors="replace") for name, data in assign.package_files(()).items()}
    assert leaks(kept) == (secrets, regions)


def function_source(text: str, name: str) -> str:
    """A top-level function's lines, with a marker that closes a region just after it."""
    node = next(n for n in ast.parse(text).body if getattr(n, "name", None) == name)
    lines = text.splitlines()
    stop = node.end_lineno
    while stop < len(lines) and lines[stop].strip() == course.END:
        stop += 1
    return "\n".join(lines[node.lineno - 1:stop]) + "\n"


def test_package_files_stubs_only_the_exercises_asked_for():
    files = assign.package_files({4})
    for exercise in course.EXERCISES:
        for module, name in exercise.functions:
            path = f"{module.replace('.', '/')}.py"  # remat.chains.plans is ag/remat/chains/plans.py
            source = function_source((PACKAGE / path).read_text(), name)
            built = function_source(files[f"ag/{path}"].decode(), name)
            assert built == course.cut_solutions(source, keep=exercise.number != 4), (exercise.number, name)
    assert "raise NotImplementedError()" in function_source(files["ag/attention/forward.py"].decode(), "tiled_forward")
    namespace = {}
    exec(files["ag/_stubbed.py"], namespace)
    assert namespace["STUBBED"] == frozenset({4})


def test_package_files_copies_every_other_file_as_it_is():
    assign._package_sources.cache_clear()  # read the package as it is now
    files = assign.package_files(e.number for e in course.EXERCISES)
    on_disk = {p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    marked = {name for name in on_disk if name.endswith(".py") and course.BEGIN in (REPO / name).read_text()}
    assert {"ag/tensor.py", "ag/discard.py", "ag/attention/forward.py", "ag/remat/chains/plans.py", "ag/remat/graphs/dtr.py"} <= marked
    marked.add("ag/_stubbed.py")
    marked |= set(course.exercises.LAB_SOLUTIONS)  # the lab's modules that solve a stubbed exercise refuse instead
    assert set(files) == on_disk | {"ag/_stubbed.py"}
    assert "ag/attention/kernels/flash_fwd.cu" in files
    assert all(files[name] == (REPO / name).read_bytes() for name in on_disk - marked)


def test_the_source_checkout_has_nothing_stubbed():
    assert assign.stubbed() == frozenset()
    assert not (PACKAGE / "_stubbed.py").exists()


def test_a_region_outside_every_exercise_function_is_an_error(tmp_path, monkeypatch):
    package = tmp_path / "ag"
    package.mkdir()
    (package / "stray.py").write_text(f"x = 1\n{course.BEGIN}\ny = 2\n{course.END}\n")
    monkeypatch.setattr(assign, "PACKAGE", package)
    with pytest.raises(ValueError, match=r"ag/stray\.py line 2: .*outside every function.*no exercise lists"):
        assign.package_files({1})
    (package / "stray.py").write_text(f"def helper():\n    {course.BEGIN}\n    return 2\n    {course.END}\n")
    with pytest.raises(ValueError, match=r"ag/stray\.py line 2: .*in helper\(\), which no exercise lists"):
        assign.package_files({1})


def test_release_refuses_to_write_over_the_source(tmp_path):
    for dest in (REPO, PACKAGE, PACKAGE / "course"):
        with pytest.raises(ValueError, match="the repository or inside its ag/"):
            assign.release(dest)


def run_from_release(release: Path, script: Path) -> subprocess.CompletedProcess:
    """Run a file with the release's ag shadowing the source checkout's."""
    env = {**os.environ, "PYTHONPATH": str(release)}
    return run([sys.executable, str(script)], cwd=script.parent, env=env)


def solved_folder(tmp_path: Path, numbers) -> Path:
    folder = tmp_path / "_".join(map(str, numbers))
    folder.mkdir()
    for n in numbers:
        shutil.copy(REPO / "solutions" / BY_NUMBER[n].filename, folder)
    return folder


def test_the_release_ag_is_the_one_imported_and_every_exercise_is_a_stub(release, tmp_path):
    script = tmp_path / "which.py"
    script.write_text("import ag\nfrom ag.course.assign import stubbed\n"
                      "print(ag.__file__)\nprint(sorted(stubbed()))\n")
    result = run_from_release(release, script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(release / "ag" / "__init__.py"), str(sorted(e.number for e in course.EXERCISES))]


@pytest.mark.parametrize("exercise", course.EXERCISES, ids=lambda e: e.name)
def test_from_the_release_a_solution_runs_with_the_ones_it_needs_beside_it(exercise, release, tmp_path):
    folder = solved_folder(tmp_path, (exercise.number, *exercise.needs))
    result = run_from_release(release, folder / exercise.filename)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == exercise.expected


@pytest.mark.parametrize("exercise", [e for e in course.EXERCISES if e.needs], ids=lambda e: e.name)
def test_from_the_release_a_solution_stops_at_a_stub_without_any_one_it_needs(exercise, release, tmp_path):
    for missing in exercise.needs:
        folder = solved_folder(tmp_path, (exercise.number, *(n for n in exercise.needs if n != missing)))
        result = run_from_release(release, folder / exercise.filename)
        assert result.returncode != 0 and "NotImplementedError" in result.stderr, (missing, result.stdout)
        shutil.rmtree(folder)


@pytest.mark.parametrize("exercise", course.EXERCISES, ids=lambda e: e.name)
def test_from_the_release_an_untouched_exercise_stops_at_a_stub(exercise, release):
    result = run_from_release(release, release / "exercises" / exercise.filename)
    assert result.returncode != 0
    assert result.stderr.strip().endswith("NotImplementedError"), result.stderr


def grade_from_release(release: Path, folder: Path) -> dict:
    """`ag grade` run as a student runs it, from the release: its ag, its public graded tests."""
    env = {**os.environ, "PYTHONPATH": str(release)}
    out = folder.parent / f"{folder.name}.json"
    result = subprocess.run([sys.executable, "-m", "ag", "grade", str(folder), "--tests",
                             str(release / "tests" / "grading"), "--json", str(out)],
                            capture_output=True, text=True, env=env, cwd=release, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_student_grades_the_solved_exercises_from_the_release_with_full_marks(release, tmp_path):
    results = grade_from_release(release, solved_folder(tmp_path, [e.number for e in course.EXERCISES]))
    assert results["score"] == results["max_score"] > 0
    assert all(t["visibility"] == "visible" for t in results["tests"])  # the hidden tests stayed home
    assert {t["name"].split(":")[0] for t in results["tests"]} == {e.module_name for e in course.EXERCISES}


def test_from_the_release_a_solved_exercise_scores_and_the_untouched_ones_do_not(release, tmp_path):
    folder = tmp_path / "half"
    shutil.copytree(release / "exercises", folder)
    for number in (1, 2, 6):  # exercise 2 runs on the student's own exercise 1
        exercise = next(e for e in course.EXERCISES if e.number == number)
        shutil.copy(REPO / "solutions" / exercise.filename, folder / exercise.filename)
    results = grade_from_release(release, folder)
    for test in results["tests"]:
        solved = test["name"].split("_")[0] in ("ex1", "ex2", "ex6")
        assert test["status"] == ("passed" if solved else "failed"), test
