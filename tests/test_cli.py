"""The ag command line, run as a user would run it."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ag.cli import MPI_LAUNCHER_VARIABLES, PARALLEL_LAUNCH


def run_ag(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ag", *args], capture_output=True, text=True, timeout=600,
                          env=env)


def test_help_lists_the_demo_subcommand():
    result = run_ag("--help")
    assert result.returncode == 0
    assert "demo" in result.stdout


def test_demo_help_lists_the_memory_demo():
    result = run_ag("demo", "--help")
    assert result.returncode == 0 and "memory" in result.stdout


def test_demo_memory_prints_the_lecture_tables():
    result = run_ag("demo", "memory")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "nbytes = 8,000,000 B" in out
    assert "memory allocated: 16 MB" in out and "memory allocated: 8 MB" in out
    assert "batch 4000: 64, 128, 192" in out
    assert "batch 4096: 32, 65, 98, 131, 163" in out
    assert "plot" not in out  # the main job draws nothing unless given --out


def test_an_unknown_demo_is_refused_with_the_choices():
    result = run_ag("demo", "nonsense")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr and "memory" in result.stderr


def test_demo_remat_prints_every_strategy_and_writes_three_plots(tmp_path):
    result = run_ag("demo", "remat", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    for strategy in ("keep all", "uniform", "block", "sqrt", "greedy", "optimal", "keep none"):
        assert f"\n{strategy}" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "remat_stack.png", "remat_timeline.png", "remat_tradeoff.png"]
    assert all(p.stat().st_size > 10_000 for p in tmp_path.iterdir())


def test_demo_remat_graph_runs_every_planner_on_three_graphs_and_writes_figure_4(tmp_path):
    pytest.importorskip("scipy", reason="the MILP needs the solver extra")
    result = run_ag("demo", "remat", "--graph", "--budgets", "2", "--time-limit", "2", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    for graph in ("residual MLP", "U-Net", "2-layer transformer"):
        assert f"{graph}: " in result.stdout
    for planner in ("checkpoint all", "sqrt", "selective", "full", "MILP", "LP rounding", "DTR", "greedy"):
        assert re.search(rf"(?m)^ *{planner}  ", result.stdout), planner
    assert [p.name for p in tmp_path.iterdir()] == ["remat_frontier.png"]
    assert (tmp_path / "remat_frontier.png").stat().st_size > 20_000


def test_graph_is_refused_for_demos_other_than_remat():
    result = run_ag("demo", "memory", "--graph")
    assert result.returncode == 2 and "--graph applies to the remat demo only" in result.stderr


def test_demo_attention_prints_the_scaling_table_and_writes_the_plot(tmp_path):
    result = run_ag("demo", "attention", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line[:6].strip().isdigit()]
    assert [int(r[0]) for r in rows] == [512, 1024, 2048, 4096, 8192, 16384]
    flash = [float(r[2]) for r in rows]  # the column after naive (a number or "(skipped)")
    assert flash[-1] / flash[0] < 40  # 32x longer sequence, about 32x the memory
    assert (tmp_path / "attention_scaling.png").stat().st_size > 10_000


@pytest.fixture(scope="module")
def transformer_demo(tmp_path_factory):
    """``ag demo transformer`` run once (about 10 s): its result and its plot folder."""
    out = tmp_path_factory.mktemp("transformer")
    return run_ag("demo", "transformer", "--out", str(out)), out


def test_demo_transformer_prints_every_setting_equal_to_its_formula_and_writes_the_plot(transformer_demo):
    result, tmp_path = transformer_demo
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if _starts_with_five_numbers(line)]  # s, b, h, a, g
    assert len(rows) == 17
    for setting in ("none", "selective", "full", "flash", "full uniform n=1, L=4", "full uniform n=2, L=4",
                    "full block n=2, L=4"):
        assert any(f" {setting} " in row for row in rows), setting
    assert any(row.split()[3:5] == ["8", "2"] for row in rows), "no GQA row (a = 8, g = 2)"
    for row in rows:
        measured, predicted, ratio = row.split()[-4:-1]  # the formula, last, has no spaces
        assert measured == predicted and ratio == "1.0000", row
    assert f"{len(rows)} of {len(rows)} rows equal the formula to the byte" in result.stdout
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "transformer_memory.png").stat().st_size > 10_000
    else:
        assert "plot skipped" in result.stdout


def test_note_5_quotes_the_table_ag_demo_transformer_prints(transformer_demo):
    result, _ = transformer_demo
    table = [line for line in result.stdout.splitlines() if _starts_with_five_numbers(line)]
    note = (Path(__file__).resolve().parent.parent / "lectures" / "05-transformer-activation-memory.md").read_text()
    assert "\n".join(table) in note, "lectures/05: paste the table `ag demo transformer` prints now"


def _starts_with_five_numbers(line: str) -> bool:
    cells = line.split()
    return len(cells) > 5 and all(cell.isdigit() for cell in cells[:5])


def test_options_of_the_parallel_demo_are_refused_elsewhere():
    result = run_ag("demo", "memory", "--check")
    assert result.returncode == 2 and "unrecognized arguments: --check" in result.stderr


def _parallel_demo_or_skip():
    for module in ("mpi4py", "ag.parallel"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"ag demo parallel needs {module}: pip install -e '.[mpi]'")


def test_demo_parallel_run_alone_says_how_to_launch_it():
    _parallel_demo_or_skip()
    env = {k: v for k, v in os.environ.items() if k not in MPI_LAUNCHER_VARIABLES}
    result = run_ag("demo", "parallel", env=env)
    assert result.returncode == 0, result.stderr
    assert PARALLEL_LAUNCH == "mpiexec -n 2 ag demo parallel"
    assert PARALLEL_LAUNCH in result.stderr


@pytest.mark.slow
def test_demo_parallel_under_mpiexec_runs_on_two_ranks_without_the_hint():
    _parallel_demo_or_skip()
    if shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec on PATH: pip install -e '.[mpi]'")
    result = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "ag", "demo", "parallel"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "1.0000" in result.stdout and PARALLEL_LAUNCH not in result.stderr


def test_gpu_attention_demo_without_a_gpu_says_why_and_fails(capsys, monkeypatch):
    from ag import cli
    from ag.attention import gpu
    monkeypatch.setattr(gpu, "available", lambda: (False, "CuPy is not importable"))
    assert cli.main(["demo", "attention", "--device", "gpu"]) == 1
    assert "no GPU here: CuPy is not importable" in capsys.readouterr().err
    assert cli.main(["demo", "memory", "--device", "gpu"]) == 2


# ---- ag grade, as a student and a TA meet it ----

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def ex3_only(tmp_path):
    """The graded tests of exercise 3 alone (a few seconds to grade), and a student whose merge is wrong."""
    tests = shutil.copytree(REPO / "tests" / "grading", tmp_path / "grading", ignore=shutil.ignore_patterns("__pycache__"))
    for other in [*tests.glob("test_ex*.py"), *tests.glob("hidden/test_*.py")]:
        if "ex3" not in other.name:
            other.unlink()
    student = tmp_path / "student"
    student.mkdir()
    source = (REPO / "exercises" / "ex3_online_softmax.py").read_text()
    (student / "ex3_online_softmax.py").write_text(source.replace("raise NotImplementedError()", "return a", 1))
    return tests, student


def test_ag_grade_prints_each_failed_tests_message_and_quiet_prints_the_scores_only(ex3_only):
    tests, student = ex3_only
    loud = run_ag("grade", str(student), "--tests", str(tests), "--timeout", "30")
    quiet = run_ag("grade", str(student), "--tests", str(tests), "--timeout", "30", "--quiet")
    assert loud.returncode == quiet.returncode == 0, loud.stderr[-2000:]
    assert "failed     0/3    ex3_online_softmax: test_two_merged_blocks" in loud.stdout
    assert "        | " in loud.stdout and "the merged softmax(s) @ v" in loud.stdout  # what was compared
    assert "| " not in quiet.stdout and "failed     0/3" in quiet.stdout and "\nscore: " in quiet.stdout


def test_ag_grade_given_a_file_says_it_wants_a_folder(tmp_path):
    file = tmp_path / "ex3_online_softmax.py"
    file.write_text("")
    result = run_ag("grade", str(file))
    assert result.returncode == 2 and f"{file} is a file" in result.stderr and "folder" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_the_repository_around_ag_the_defaults_say_what_to_pass(tmp_path, monkeypatch, capsys):
    """An install from a wheel (site-packages, no tests/grading beside ag) cannot find the graded tests."""
    from ag import cli, course
    monkeypatch.setattr(course, "REPO", tmp_path / "site-packages")
    student = tmp_path / "student"
    student.mkdir()
    assert cli.main(["grade", str(student)]) == 2
    assert "pass --tests FOLDER" in capsys.readouterr().err
    assert cli.main(["grade", "--autograder", str(tmp_path / "a.zip")]) == 2
    assert "run it from a checkout" in capsys.readouterr().err and not (tmp_path / "a.zip").exists()


def test_a_submission_the_judge_could_not_grade_exits_non_zero_and_writes_no_results(tmp_path, monkeypatch, capsys):
    from ag import cli, course

    def broken(*args, **kwargs):
        raise RuntimeError("grade: the judge stopped \x1b[2J")
    monkeypatch.setattr(course, "grade", broken)
    student = tmp_path / "student"
    student.mkdir()
    code = cli.main(["grade", str(student), "--tests", str(REPO / "tests" / "grading"),
                     "--json", str(tmp_path / "out" / "results.json")])
    out, err = capsys.readouterr()
    assert code == 3 and "not graded: grade: the judge stopped \\x1b[2J" in err and "score" not in out
    assert not (tmp_path / "out" / "results.json").exists()
