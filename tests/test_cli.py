"""The ag command line, run as a user would run it."""
import subprocess
import sys


def run_ag(*args):
    return subprocess.run([sys.executable, "-m", "ag", *args], capture_output=True, text=True, timeout=600)


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


def test_an_unknown_demo_is_refused_with_the_choices():
    result = run_ag("demo", "nonsense")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr and "memory" in result.stderr


def test_demo_remat_prints_every_strategy_and_writes_three_plots(tmp_path):
    result = run_ag("demo", "remat", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    for strategy in ("none", "uniform", "block", "sqrt", "greedy", "optimal", "all"):
        assert f"\n{strategy}" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "remat_stack.png", "remat_timeline.png", "remat_tradeoff.png"]
    assert all(p.stat().st_size > 10_000 for p in tmp_path.iterdir())


def test_demo_attention_prints_the_scaling_table_and_writes_the_plot(tmp_path):
    result = run_ag("demo", "attention", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line[:6].strip().isdigit()]
    assert [int(r[0]) for r in rows] == [512, 1024, 2048, 4096, 8192, 16384]
    flash = [float(r[2]) for r in rows]  # the column after naive (a number or "(skipped)")
    assert flash[-1] / flash[0] < 40  # 32x longer sequence, about 32x the memory
    assert (tmp_path / "attention_scaling.png").stat().st_size > 10_000
