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
from typing import Callable

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
