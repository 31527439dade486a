"""Contestants timed side by side in one process: each run starts on an idle machine.

The runs take turns, so that drift in the machine's speed hits every contestant alike. Before each
run the garbage is collected and the script waits ``SETTLE`` seconds. After a parallel call, the
worker threads of OpenMP (torch) and of OpenBLAS (NumPy) spin for a while before they sleep; a run
that starts while the other framework's threads still spin shares the cores with them. Measured on
the AMD EPYC machine (2 vCPUs, N = 1024, float32): ag's flash_attention took 35 ms right after
torch SDPA and 17 ms 0.1 s later; torch SDPA took 25 ms right after ag's naive attention (OpenBLAS,
2 threads) and 12.6 ms 0.1 s later. A framework's own threads spinning inside its own step still
count against it.

What lives before the first run (the modules of torch, above all) is collected once and then frozen
(``gc.freeze``) until the last run is done: a full collection walks every object, and with torch
imported each took 148 ms on a Zen 3, 24 s of 42 in ``attention.py --quick``'s timing. A collection
that a run sets off is shorter too, and the same for every contestant: it no longer walks torch's
objects, which none of them made.
"""
from __future__ import annotations

import gc
import time
from typing import Callable

SETTLE = 0.2  # seconds; 0.05 was not enough after OpenBLAS in the measurement above, 0.1 was


def take_turns(runs: dict[str, Callable[[], object]], repeats: int | dict[str, int],
               settle: float = SETTLE) -> dict[str, list[float]]:
    """Seconds per call of each run, the runs taking turns; ``repeats`` calls of each (a count, or one
    count per name: a run with fewer sits out the later turns)."""
    counts = repeats if isinstance(repeats, dict) else dict.fromkeys(runs, repeats)
    times: dict[str, list[float]] = {name: [] for name in runs}
    gc.collect()
    gc.freeze()
    try:
        for turn in range(max(counts.values(), default=0)):
            for name, run in runs.items():
                if turn < counts[name]:
                    gc.collect()
                    time.sleep(settle)
                    start = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - start)
    finally:
        gc.unfreeze()
    return times
