"""Peak memory of one step, measured the same way for any framework: RSS growth in a fresh subprocess.

tracemalloc sees NumPy's buffers but not torch's, so the benchmarks compare frameworks by the
resident set instead: the peak (VmHWM, reset through /proc/self/clear_refs, Linux only) during
one step minus the resident set before it. The worker runs with glibc's mmap threshold fixed,
so every large array is mapped on allocation and unmapped on free and the RSS follows the live
bytes. Each worker is a fresh process, so one measurement leaves nothing behind for the next.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Hashable

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss_peak_of(step: Callable[[], object]) -> tuple[int, int]:
    """(peak RSS growth, RSS still grown after) in bytes, during one call of ``step``."""
    gc.collect()
    before = _status_kb("VmRSS")
    _reset_peak_rss()
    step()
    peak = _status_kb("VmHWM")
    after = _status_kb("VmRSS")
    return (peak - before) * 1024, (after - before) * 1024


def run_worker(cmd: list[str], what: str) -> dict:
    """Run ``cmd`` in a fresh process under ``MALLOC_ENV``; return the JSON on its last stdout line."""
    env = dict(os.environ, **MALLOC_ENV)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory worker for {what} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_workers(commands: dict[Hashable, tuple[list[str], str]], at_once: int | None = None) -> dict:
    """``run_worker(cmd, what)`` for every ``key: (cmd, what)``, ``at_once`` workers at a time (default:
    the cores this process may run on); their results by key. Each worker is a process of its own,
    whose peak is its own resident set, so running them side by side changes their wall time, not
    their figures: the transformer's six --quick workers on a 2-vCPU Zen 3 took 17.5 s two at a time,
    21.2 one at a time, with the same peaks (within 0.5 MB, as between two runs one at a time)."""
    if at_once is None:
        at_once = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=max(1, at_once)) as pool:
        futures = {key: pool.submit(run_worker, cmd, what) for key, (cmd, what) in commands.items()}
        return {key: future.result() for key, future in futures.items()}
