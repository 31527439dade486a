"""``--busy``'s spinning process (benchmarks/_busy.py): it runs while the block runs and is gone after,
also when the block raises or the benchmark that started it dies. Nothing here is timed."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from _busy import busy_core  # noqa: E402


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie that nobody reaped yet has stopped running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


def test_busy_core_starts_a_spinning_process_and_kills_it_after_the_block():
    with busy_core() as process:
        assert process.poll() is None and _running(process.pid)
        cpu = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert cpu[0] in ("R", "S")  # running, or between time slices
    assert process.poll() is not None and not _running(process.pid)


def test_busy_core_kills_its_process_when_the_block_raises():
    with pytest.raises(RuntimeError, match="inside"):
        with busy_core() as process:
            pid = process.pid
            raise RuntimeError("inside")
    assert not _running(pid)


def test_the_spinning_process_stops_by_itself_when_the_benchmark_dies():
    script = (f"import os, sys; sys.path.insert(0, {str(BENCHMARKS)!r}); from _busy import busy_core\n"
              "with busy_core() as p:\n    print(p.pid, flush=True)\n    os._exit(0)\n")
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    pid = int(parent.stdout.split()[0])
    assert _gone_within(pid, 30), f"the spinner {pid} outlived the benchmark that started it"


def test_busy_report_prints_idle_busy_and_their_ratio_and_a_goal_line_for_each_ag_step(capsys):
    from _busy import busy_report
    from mlp import print_table
    medians = busy_report("a step", {"ag": lambda: None, "ag lab": lambda: None, "torch": lambda: None},
                          1, "nothing", print_table)
    out = capsys.readouterr().out
    assert "| step " in out and "idle ms" in out and "busy ms" in out and "busy / idle" in out
    goals = [line for line in out.splitlines() if line.startswith("goal:")]
    assert [line.split(",")[1].strip() for line in goals] == ["ag", "ag lab"]  # torch is there to compare with
    assert set(medians) == {"ag", "ag lab", "torch"} and all(idle > 0 and busy > 0 for idle, busy in medians.values())
