"""Every benchmark's ratio tables on this machine, one after another, and their goals at the end.

    python benchmarks/run_all.py --quick    # small sizes: under 3 minutes on 2 cores
    python benchmarks/run_all.py            # the full sizes of each script: about half an hour
    python benchmarks/run_all.py --busy --quick   # the MLP, transformer and flash steps idle and with
                                                  # one core kept busy (``_busy.py``), both paths and torch

Each script runs in its own process (as you would run it), its output streamed; every script ends
with one ``goal: ...: met`` or ``...: missed`` line per goal (``benchmarks/_goals.py``), and those
lines are gathered at the end. ``attention.py`` runs twice: with the lab on (its default) and with
``--classroom``, each against its own goals (issue 49); the MLP and the transformer time the
classroom path by default (``mlp.py`` the lab's beside it). ``grading.py`` is left out (it needs root and a
class of copies); run it on its own.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {  # a script and its own arguments: extra arguments with --quick
    "mlp.py": [],
    "op_overhead.py": [],
    "remat.py": [],
    "attention.py": ["--skip", "sweep,anatomy"],
    "attention.py --classroom": ["--skip", "sweep,memory,anatomy,variants"],
    "transformer.py": [],
    "remat_solver.py": ["--part", "2", "--time-limit", "3", "--repeats", "3"],  # 3 s: a fixed plan backs it up
}
BUSY_SCRIPTS = {"mlp.py": ["--dtypes", "float32"], "transformer.py": [], "attention.py": ["--sizes", "1024,4096"]}
# without --quick: the classroom's attention skips the lab's tile tables (sweep, anatomy) and the
# variants, which run the same passes on either path
FULL = {"attention.py --classroom": ["--skip", "sweep,anatomy,variants"]}


def command_for(script: str, quick: bool, busy: bool) -> list[str]:
    """The command that runs ``script`` (a file, then any arguments of its own) as ``--quick`` and
    ``--busy`` ask."""
    name, *own = script.split()
    command = [sys.executable, os.path.join(HERE, name), *own]
    if busy:
        return command + ["--busy", *(["--quick"] if quick else []), *BUSY_SCRIPTS[script]]
    return command + (["--quick", *SCRIPTS[script]] if quick else FULL.get(script, []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each script's --quick sizes")
    parser.add_argument("--only", help="comma-separated scripts to run (default: all)")
    parser.add_argument("--busy", action="store_true", help="only the steps idle and with one core kept busy")
    args = parser.parse_args()
    scripts = BUSY_SCRIPTS if args.busy else SCRIPTS
    chosen = args.only.split(",") if args.only else list(scripts)
    verdicts, start = [], time.perf_counter()
    for script in chosen:
        command = command_for(script, args.quick, args.busy)
        print(f"\n===== {' '.join(['python', 'benchmarks/' + script.split()[0], *command[2:]])}", flush=True)
        began = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in process.stdout:
            print(line, end="", flush=True)
            text = line.strip()
            if text.startswith("goal"):
                verdicts.append(f"{script}: {text}")
        if process.wait() != 0:
            verdicts.append(f"{script}: FAILED with exit code {process.returncode}")
        print(f"===== {script}: {time.perf_counter() - began:.0f} s", flush=True)
    print(f"\nGoals ({time.perf_counter() - start:.0f} s in all):")
    for line in verdicts:
        print("  " + line)


if __name__ == "__main__":
    main()
