"""Python overhead per op on tiny tensors: ag against PyTorch CPU eager, in microseconds per op.

    python benchmarks/op_overhead.py            # about half a minute
    python benchmarks/op_overhead.py --quick    # a few seconds, noisier

On tensors of 4 or 16 elements the arithmetic is next to nothing, so what is measured is the
cost of the framework around it: checking operands, wrapping the result, recording the graph
and, for backward, sorting it and running the closures; and the cost of NumPy's own call, which
is 0.2 µs for an add but 0.3-0.8 µs for a reduction or a matrix product, and 0.5 µs with a
Python-number operand. Three settings:

- forward, no graph: inputs do not require grad, so no graph is recorded ("numpy µs" is the
  NumPy call inside ag's op, alone: what is left of ag's figure is its Python);
- forward, graph: inputs require grad, so each op records its backward;
- forward + backward: the op, then ``out.backward(seed)`` (``out.backward()`` for ``sum``),
  the grads accumulating into the leaves' ``.grad``.

Each figure is the best of ``--repeats`` timeit runs, each run given enough loops to last
about ``--min-time`` seconds; the best is the one least disturbed by other processes. The
frameworks take turns, a run each, so that the machine's drift hits them alike.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import timeit
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ag  # noqa: E402
from _goals import goal  # noqa: E402
from mlp import print_table  # noqa: E402

# "add+add" is (a + b) + b: the second add frees the first's output, which no backward reads and
# nothing but the graph holds (the engine's rule 7); its figures are for both adds
OPS = ["add", "mul", "matmul", "relu", "sum", "add+add"]
SHAPES = {"add": (4,), "mul": (4,), "matmul": (4, 4), "relu": (4,), "sum": (4,), "add+add": (4,)}


def numpy_op(name: str, a: np.ndarray, b: np.ndarray) -> Callable[[], object]:
    """The NumPy call that ag's op makes, alone (relu's zero is a 0-d array of a's dtype, made once;
    a short float vector is summed as its dot product with ones, made once, into a 0-d array)."""
    zero, ones = np.zeros((), a.dtype), np.ones(a.shape, a.dtype)
    return {"add": lambda: a + b, "mul": lambda: a * b, "matmul": lambda: a.dot(b),
            "relu": lambda: np.maximum(a, zero),
            "sum": lambda: a.dot(ones, np.empty((), a.dtype)), "add+add": lambda: (a + b) + b}[name]


def ag_op(name: str, a: ag.Tensor, b: ag.Tensor) -> Callable[[], ag.Tensor]:
    return {"add": lambda: a + b, "mul": lambda: a * b, "matmul": lambda: a @ b,
            "relu": lambda: ag.relu(a), "sum": lambda: ag.sum(a), "add+add": lambda: (a + b) + b}[name]


def torch_op(name: str, a, b):
    import torch
    return {"add": lambda: a + b, "mul": lambda: a * b, "matmul": lambda: a @ b,
            "relu": lambda: torch.relu(a), "sum": lambda: torch.sum(a), "add+add": lambda: (a + b) + b}[name]


def cases(name: str) -> dict[str, dict[str, Callable[[], object]]]:
    """For each setting, the statement to time per framework."""
    import torch
    rng = np.random.default_rng(0)
    shape = SHAPES[name]
    a_np, b_np = rng.standard_normal(shape), rng.standard_normal(shape)
    seed_np = np.ones(() if name == "sum" else shape)

    def ag_tensors(requires_grad: bool):
        return (ag.Tensor(a_np.copy(), requires_grad=requires_grad),
                ag.Tensor(b_np.copy(), requires_grad=requires_grad))

    def torch_tensors(requires_grad: bool):
        return (torch.tensor(a_np, requires_grad=requires_grad),
                torch.tensor(b_np, requires_grad=requires_grad))

    ag_const, t_const = ag_op(name, *ag_tensors(False)), torch_op(name, *torch_tensors(False))
    ag_f, t_f = ag_op(name, *ag_tensors(True)), torch_op(name, *torch_tensors(True))
    seed_t = torch.tensor(seed_np)

    if name == "sum":
        def ag_fwd_bwd():
            ag_f().backward()

        def torch_fwd_bwd():
            t_f().backward()
    else:
        def ag_fwd_bwd():
            ag_f().backward(seed_np)

        def torch_fwd_bwd():
            t_f().backward(seed_t)

    return {
        "forward, no graph": {"numpy": numpy_op(name, a_np, b_np), "ag": ag_const, "torch": t_const},
        "forward, graph": {"ag": ag_f, "torch": t_f},
        "forward + backward": {"ag": ag_fwd_bwd, "torch": torch_fwd_bwd},
    }


def microseconds(stmts: dict[str, Callable[[], object]], repeats: int, min_time: float) -> dict[str, float]:
    """Per framework, the best of ``repeats`` timeit runs, in µs of this process's CPU time per call.

    The frameworks take turns, one run each per turn, as in ``_timing.take_turns``: this machine's
    speed drifts over seconds (on a Zen 3 guest a whole 5-run block of one framework came out 2 to 3
    times slower than the other's, ratios of 0.50 to 1.70 for the same op), and turns let the drift
    hit every framework alike. A tiny op runs on one thread in both frameworks, so CPU time is its
    wall time on an idle machine, and other processes on a busy one do not count."""
    timers = {fw: timeit.Timer(stmt, timer=time.process_time) for fw, stmt in stmts.items()}
    loops = {fw: max(100, int(100 * min_time / max(timer.timeit(number=100), 1e-9)))
             for fw, timer in timers.items()}
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(repeats):
        for fw, timer in timers.items():
            best[fw] = min(best[fw], timer.timeit(number=loops[fw]) / loops[fw] * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 turns of 0.01 s runs")
    parser.add_argument("--repeats", type=int, default=15, help="turns: one timeit run of each framework a turn")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per timeit run")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.min_time = 10, 0.01
    import torch

    print(f"Per-op overhead, float64, shapes {', '.join(f'{op} {SHAPES[op]}' for op in OPS)}")
    print(f"Python {sys.version.split()[0]}, numpy {np.__version__}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); best of {args.repeats} timeit runs of ~{args.min_time} s, "
          f"the frameworks taking turns")
    print(f"load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    us: dict[tuple[str, str], dict[str, float]] = {}
    for op in OPS:
        for setting, stmts in cases(op).items():
            us[op, setting] = microseconds(stmts, args.repeats, args.min_time)

    for setting in dict.fromkeys(setting for _, setting in us):
        rows = []
        for op in OPS:
            t = us[op, setting]
            rows.append([op] + ([f"{t['numpy']:.2f}"] if "numpy" in t else [])
                        + [f"{t['ag']:.2f}", f"{t['torch']:.2f}", f"{t['ag'] / t['torch']:.2f}"])
        header = ["op"] + (["numpy µs"] if len(rows[0]) == 5 else []) + ["ag µs", "torch µs", "ag/torch"]
        print_table(f"{setting} (µs per op)", header, rows)
    print()
    for setting, limit in GOALS.items():
        for op in OPS:
            t = us[op, setting]
            goal(f"{op}, {setting}, ag / torch", t["ag"] / t["torch"], limit, limited_by=limited_by(op, setting, us))


GOALS = {"forward, graph": 1.0, "forward + backward": 1.0}  # issue 14: at most torch's overhead


def limited_by(op: str, setting: str, us: dict[tuple[str, str], dict[str, float]]) -> str:
    """What a missed goal is limited by, from this run's own figures."""
    if setting != "forward, graph":
        return "Python: ag's backward is interpreted closures, torch's one C++ autograd engine"
    numpy_us, graph = us[op, "forward, no graph"]["numpy"], us[op, setting]
    return (f"Python: NumPy's own call takes {numpy_us:.2f} µs ({numpy_us / graph['torch']:.0%} of torch's "
            f"whole op), and ag's interpreted bookkeeping around it (operands, closure, Tensor, graph) "
            f"{graph['ag'] - numpy_us:.2f} µs, where torch's is one C++ dispatch")

if __name__ == "__main__":
    main()
