"""The red team against the judge and the command line (issue 48, holes 3 to 7).

Each case grades a hostile submission (or class) through ``ag grade`` as a TA runs it, and checks
that the attack scores 0 on the exercises it touches and full marks elsewhere, that nothing it was
after leaks (the TA's token, a marker its modules would write), that nothing is clobbered (a victim
file behind a planted link) and that nothing it names reaches a terminal or a spreadsheet raw.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ag import course

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/grading.py imports its neighbours
SOLUTIONS, STUBS = REPO / "solutions", REPO / "exercises"
EXERCISES = {e.number: e for e in course.EXERCISES}
TIMEOUT = 20  # the solutions need 1-2 s of it; room for a machine shared with other jobs
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
# what a terminal obeys: ESC, CSI (C1), CR, BEL, a right-to-left override
RAW_CONTROLS = ("\x1b", "\x9b", "\r", "\x07", "\u202e")


def ag_command() -> list[str]:
    """The `ag` a TA types: the console script, whose path never holds the current folder."""
    script = Path(sys.executable).with_name("ag")
    return [str(script)] if script.exists() else [sys.executable, "-P", "-m", "ag"]


def run_ag(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([*ag_command(), *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


def student(folder: Path, *, stubs=(), missing=()) -> Path:
    """A copy of solutions/, with the exercises in ``stubs`` left as the student's stub."""
    folder.mkdir(parents=True)
    for e in course.EXERCISES:
        if e.number not in missing:
            shutil.copy((STUBS if e.number in stubs else SOLUTIONS) / e.filename, folder / e.filename)
    return folder


def scores_problems(results: dict, attacked: set[int]) -> list[str]:
    """Every test of an attacked exercise failed with 0, every other one passed with full marks."""
    problems = []
    for t in results["tests"]:
        number = int(t["name"].split("_")[0][2:])
        if number in attacked and (t["score"] != 0 or t["status"] != "failed"):
            problems.append(f"the attack scored: {t['name']} {t['score']}")
        if number not in attacked and (t["score"] != t["max_score"] or t["status"] != "passed"):
            problems.append(f"an untouched exercise lost points: {t['name']}: {t['output'][:300]}")
    return problems


def read_csv(path: Path) -> dict[str, dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {row["student"]: row for row in rows}


# ---- hole 3: the judge runs nothing from the TA's current folder ----

SHADOWS = ("numpy", "pytest", "_pytest", "ag", "sitecustomize", "usercustomize", "conftest", "references")


def plant_shadows(folder: Path, marker: Path) -> None:
    """Modules named like the ones the judge imports, each writing ``marker/<name>`` when imported."""
    for name in SHADOWS:
        code = f"import pathlib\npathlib.Path({str(marker)!r}, {name!r}).write_text('imported')\n"
        if name in ("ag", "_pytest"):
            (folder / name).mkdir()
            (folder / name / "__init__.py").write_text(code)
        else:
            (folder / f"{name}.py").write_text(code)
    (folder / "pytest.ini").write_text("[pytest]\naddopts = -p conftest\n")


@pytest.mark.slow
def test_grading_from_inside_the_students_folder_imports_none_of_its_modules(tmp_path):
    mallory = student(tmp_path / "mallory", stubs={3})
    marker = tmp_path / "markers"
    marker.mkdir()
    plant_shadows(mallory, marker)
    out = tmp_path / "out" / "results.json"
    result = run_ag("grade", ".", "--json", out, "--timeout", TIMEOUT, cwd=mallory)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in marker.iterdir()) == [], "the judge or the CLI imported the student's modules"
    assert scores_problems(json.loads(out.read_text()), {3}) == []


# ---- the TA's token ----

LEAK_ENVIRONMENT = '''

def _secrets_in_reach():
    """Every NAME=value with TOKEN, KEY or SECRET in its name, from the files beside this one (a
    classmate's exercise, a link the judge followed) and the environment of every ancestor."""
    import glob
    import os
    texts, pid = ["\\0".join(f"{k}={v}" for k, v in os.environ.items())], os.getpid()
    for path in glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*")):
        try:
            texts.append(open(path, "rb").read().decode(errors="replace"))
        except OSError:
            pass
    while pid > 1:
        try:
            texts.append(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
            pid = int(open(f"/proc/{pid}/status").read().split("PPid:")[1].split()[0])
        except (OSError, ValueError, IndexError):
            break
    pairs = {p for t in texts for p in t.replace("\\n", "\\0").split("\\0") if "=" in p}
    wanted = sorted(p for p in pairs if any(w in p.split("=")[0] for w in ("TOKEN", "KEY", "SECRET")))
    return f"looked in {len(texts)} places; found: " + " ".join(wanted)
'''


def leak_in_every_function(source: str, number: int) -> str:
    """The stub with each graded function raising the environments it can reach as its message."""
    names = [name for _, name in EXERCISES[number].functions]
    wrapped = "".join(f"\n\ndef {name}(*args, **kwargs):\n    raise RuntimeError(_secrets_in_reach())\n"
                      for name in names)
    return source + LEAK_ENVIRONMENT + wrapped


@pytest.mark.slow
@pytest.mark.skipif(not IS_ROOT, reason="needs root for the worker's PID namespace (without it the worker "
                    "runs as the TA and may read the TA's own processes: isolation reduced)")
def test_the_tas_token_reaches_no_student_code_and_no_text_a_student_sees(tmp_path):
    token = f"tok-{secrets.token_hex(12)}"
    mallory = student(tmp_path / "mallory", missing={5})
    (mallory / EXERCISES[2].filename).write_text(leak_in_every_function((STUBS / EXERCISES[2].filename).read_text(), 2))
    (mallory / EXERCISES[5].filename).symlink_to("/proc/self/environ")  # read by whoever reads the folder
    out = tmp_path / "out" / "results.json"
    env = {**os.environ, "TA_API_TOKEN": token}
    result = run_ag("grade", mallory, "--json", out, "--timeout", TIMEOUT, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    assert token not in result.stdout + result.stderr + text
    assert "looked in" in text, "the attack did not get to look: the case proves nothing"
    assert scores_problems(json.loads(text), {2, 5}) == []


# ---- hole 5: a link where the results go ----

def plant_link(where: Path, victim: Path) -> Path:
    victim.write_text("the TA's file\n")
    where.parent.mkdir(parents=True, exist_ok=True)
    where.symlink_to(victim)
    return where


def test_json_through_a_link_in_the_students_folder_is_refused_and_the_victim_untouched(tmp_path):
    mallory = student(tmp_path / "mallory")
    link = plant_link(mallory / "results.json", tmp_path / "victim.txt")
    result = run_ag("grade", mallory, "--json", link, "--timeout", TIMEOUT)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "symbolic link" in result.stderr and str(link) in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "victim.txt").read_text() == "the TA's file\n" and link.is_symlink()


def test_a_gradebook_through_a_link_is_refused_before_anyone_is_graded(tmp_path):
    student(tmp_path / "class" / "alice")
    link = plant_link(tmp_path / "class" / "alice" / "book.csv", tmp_path / "victim.txt")
    started = time.perf_counter()
    result = run_ag("grade", tmp_path / "class", "--csv", link)
    assert result.returncode == 2 and "symbolic link" in result.stderr, result.stderr
    assert time.perf_counter() - started < 60, "the link was refused only after grading"
    assert (tmp_path / "victim.txt").read_text() == "the TA's file\n"


@pytest.mark.slow
def test_a_link_planted_in_the_results_folder_leaves_that_student_not_graded_and_the_victim_untouched(tmp_path):
    student(tmp_path / "class" / "alice")
    student(tmp_path / "class" / "bob")
    results = tmp_path / "results"
    plant_link(results / "alice.json", tmp_path / "victim.txt")
    result = run_ag("grade", tmp_path / "class", "--csv", tmp_path / "book.csv", "--json-dir", results,
                    "--timeout", TIMEOUT)
    assert result.returncode == 3, result.stderr[-3000:]
    assert "not graded: alice: results not written" in result.stderr
    assert (tmp_path / "victim.txt").read_text() == "the TA's file\n"
    rows = read_csv(tmp_path / "book.csv")
    assert rows["alice"]["total"] == "" and rows["alice"]["error"].startswith("not graded: results not written")
    assert rows["bob"]["total"] == rows["bob"]["max_total"] != "0"
    assert json.loads((results / "bob.json").read_text())["score"] > 0


# ---- holes 4 and 6: what a terminal and a spreadsheet are shown ----

FORMULA = '=HYPERLINK("http:"&CHAR(47)&CHAR(47)&"x","y")'  # a folder's name holds no '/'

ESCAPES = "\x1b[2J\x1b[H\r\x07"
NOTEBOOK = f"{ESCAPES}passed 68-68\u202e.ipynb"


@pytest.mark.slow
def test_names_that_are_formulas_or_terminal_escapes_reach_the_gradebook_and_the_terminal_neutralised(tmp_path):
    klass = tmp_path / "class"
    student(klass / FORMULA)
    mallory = student(klass / f"mal{ESCAPES}lory\u202e", missing={3})
    (mallory / NOTEBOOK).write_text("{not a notebook")
    book = tmp_path / "book.csv"
    result = run_ag("grade", klass, "--csv", book, "--json-dir", tmp_path / "results", "--jobs", 2,
                    "--timeout", TIMEOUT)
    single = run_ag("grade", mallory, "--json", tmp_path / "mallory.json", "--timeout", TIMEOUT)
    assert result.returncode == 0 and single.returncode == 0, result.stderr[-2000:] + single.stderr[-2000:]
    shown = result.stdout + result.stderr + single.stdout + single.stderr + book.read_text()
    assert [c for c in RAW_CONTROLS if c in shown] == []
    assert "\\x1b[2J" in single.stderr and "passed 68-68\\u202e.ipynb" in single.stderr
    rows = read_csv(book)
    assert rows["'" + FORMULA]["total"] == rows["'" + FORMULA]["max_total"]
    name = "mal\\x1b[2J\\x1b[H\\x0d\\x07lory\\u202e"
    assert "\\x1b[2J" in rows[name]["error"] and rows[name][EXERCISES[3].module_name] == "0"
    assert scores_problems(json.loads((tmp_path / "mallory.json").read_text()), {3}) == []


# ---- names and messages that no UTF-8 writer takes, names too long for a results file ----

UNDECODABLE = os.fsdecode(b"bob\xff")  # a folder name whose bytes are not UTF-8: Python holds a lone surrogate
LONG, TOO_LONG = "c" * 250, "d" * 253  # with ".json": 255 bytes, the most a name may have; 258
SURROGATE_RAISE = 'def merge_softmax_blocks(a, b):\n    raise ValueError("no UTF-8 holds this: \\ud800")\n'


@pytest.mark.slow
def test_undecodable_and_long_names_and_a_lone_surrogate_in_a_message_cost_no_one_else_their_grade(tmp_path):
    """Before: a lone surrogate stopped the gradebook's writer (no gradebook for anyone), a name too long for a
    temporary file beside its results stopped the class, and a message holding one stopped ``ag grade`` before
    it wrote results.json."""
    klass = tmp_path / "class"
    for name in (LONG, UNDECODABLE, TOO_LONG):
        student(klass / name)
    mallory = student(tmp_path / "mallory")
    with open(mallory / EXERCISES[3].filename, "a") as f:
        f.write("\n\n" + SURROGATE_RAISE)
    book, results = tmp_path / "book.csv", tmp_path / "results"
    result = run_ag("grade", klass, "--csv", book, "--json-dir", results, "--jobs", 2, "--timeout", TIMEOUT)
    single = run_ag("grade", mallory, "--json", tmp_path / "mallory.json", "--timeout", TIMEOUT)
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr[-2000:]
    rows = read_csv(book)
    for name in (LONG, "bob\\udcff"):
        assert rows[name]["total"] == rows[name]["max_total"] != "", (name, rows[name])
    assert rows[TOO_LONG]["total"] == "" and "File name too long" in rows[TOO_LONG]["error"]
    assert f"not graded: {TOO_LONG}: results not written" in result.stderr
    assert (results / f"{LONG}.json").exists() and (results / f"{UNDECODABLE}.json").exists()
    assert single.returncode == 0, single.stderr[-2000:]
    assert "no UTF-8 holds this: \\ud800" in single.stdout
    assert scores_problems(json.loads((tmp_path / "mallory.json").read_text()), {3}) == []


# ---- hole 7: a student who sleeps past the timeout in every test ----

def sleepy(folder: Path, seconds: float) -> Path:
    """Every exercise a stub whose graded functions sleep ``seconds`` first (the benchmark's slow student)."""
    spec = importlib.util.spec_from_file_location("grading_benchmark", REPO / "benchmarks" / "grading.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    return benchmark.make_slow(folder, seconds)


@pytest.mark.slow
def test_a_student_sleeping_past_the_timeout_in_every_test_costs_at_most_the_cap(tmp_path):
    timeout, cap = 2, 12
    out = tmp_path / "results.json"
    started = time.perf_counter()
    result = run_ag("grade", sleepy(tmp_path / "sloth", timeout + 0.5), "--json", out, "--timeout", timeout,
                    "--student-timeout", cap)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]
    tests = json.loads(out.read_text())["tests"]
    assert len(tests) * timeout > 3 * cap, "too few tests for the cap to matter: the case proves nothing"
    assert seconds < cap + 30, f"graded in {seconds:.0f} s, against a cap of {cap} s"
    assert all(t["score"] == 0 for t in tests)
    stopped = [t for t in tests if f"stopped: the per-student limit of {cap} s" in t["output"]]
    assert len(stopped) > len(tests) // 2 and "the per-student limit" in result.stdout


@pytest.mark.slow
def test_a_slow_student_holds_a_class_up_by_at_most_the_cap_and_the_next_is_graded_in_full(tmp_path):
    cap = 60  # room for the solutions' own grading on a loaded machine
    sleepy(tmp_path / "class" / "a-sloth", TIMEOUT + 0.5)
    student(tmp_path / "class" / "b-alice")
    started = time.perf_counter()
    result = run_ag("grade", tmp_path / "class", "--csv", tmp_path / "book.csv", "--json-dir", tmp_path / "results",
                    "--timeout", TIMEOUT, "--student-timeout", cap)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_csv(tmp_path / "book.csv")
    assert rows["a-sloth"]["total"] == "0" and rows["b-alice"]["total"] == rows["b-alice"]["max_total"] != "0"
    tests = json.loads((tmp_path / "results" / "a-sloth.json").read_text())["tests"]
    assert len(tests) * TIMEOUT > cap + 120, "too few tests for the cap to matter: the case proves nothing"
    assert seconds < cap + 100, f"the class took {seconds:.0f} s, against a cap of {cap} s"
