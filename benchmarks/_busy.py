"""``--busy``: each step timed on an idle machine and again while another process keeps one core busy.

Issue 49's goal: with one core busy, no benchmark step of either path (the classroom's, the lab's)
takes more than ``BUSY_GOAL`` × its idle time; torch's step is timed beside them. The busy process
is a spinning NumPy loop in a process of its own, one thread, pinned to no core (the scheduler puts
it where it likes, as it does a student's browser or a grader's second job). It is killed when the
block ends, and it stops by itself once the benchmark that started it is gone.

Idle and busy runs alternate, a round of each contestant at a time, so that drift in the machine's
speed (other users) hits both columns alike.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
from typing import Callable, Iterator

from _goals import goal, shown
from _timing import take_turns

BUSY_GOAL = 2.0  # busy time / idle time, every step of either path
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# sums a short vector forever; checks now and then that the benchmark that started it still runs
SPIN = """import os, sys
import numpy as np
parent, x = int(sys.argv[1]), np.ones(4096)
print("spinning", flush=True)
while True:
    for _ in range(10000):
        x.sum()
    if os.getppid() != parent:
        break
"""


@contextlib.contextmanager
def busy_core() -> Iterator[subprocess.Popen]:
    """One core kept busy by a spinning process for the block; the process is killed after it."""
    env = {**os.environ, **dict.fromkeys(THREAD_VARIABLES, "1")}
    process = subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid())], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        if process.stdout.readline().strip() != "spinning":  # timed only once it spins
            raise RuntimeError(f"--busy: the spinning process exited with code {process.wait()} before it spun")
        yield process
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def idle_and_busy(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[float, float]]:
    """The median seconds of each run idle and with one core busy, ``rounds`` rounds of each, alternating."""
    idle: dict[str, list[float]] = {name: [] for name in runs}
    busy: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, times in take_turns(runs, 1).items():
            idle[name] += times
        with busy_core():
            for name, times in take_turns(runs, 1).items():
                busy[name] += times
    return {name: (statistics.median(idle[name]), statistics.median(busy[name])) for name in runs}


def busy_report(what: str, runs: dict[str, Callable[[], object]], rounds: int, limited_by: str,
                print_table: Callable) -> dict[str, tuple[float, float]]:
    """Time ``runs`` idle and busy, print the table (idle ms, busy ms, busy / idle) and one goal line
    for each run but torch's, which is there to compare with."""
    for run in runs.values():
        run()  # warm-up
    medians = idle_and_busy(runs, rounds)
    rows = [[name, f"{idle * 1e3:.1f}", f"{busy * 1e3:.1f}", shown(busy / idle, BUSY_GOAL)]
            for name, (idle, busy) in medians.items()]
    print_table(f"{what} with one core kept busy by another process (median of {rounds} rounds; "
                f"goal: busy / idle <= {BUSY_GOAL:g}; {os.cpu_count()} cores)",
                ["step", "idle ms", "busy ms", "busy / idle"], rows)
    for name, (idle, busy) in medians.items():
        if not name.startswith("torch"):
            goal(f"{what}, {name}, busy / idle (median)", busy / idle, BUSY_GOAL, limited_by=limited_by)
    return medians
