"""Time and memory of one optimizer step: ag.optim against torch.optim (CPU eager).

    python benchmarks/optim.py            # SGD with momentum, Adam, AdamW on 1, 4 and 17 M float32 parameters
    python benchmarks/optim.py --quick    # 0.3 and 4 M parameters, a few seconds

The parameters are an MLP's: ``--layers`` weights of width × width and their biases, with fixed
grads; the same arrays for both frameworks. Time is the median (and the best) of ``--repeats``
steps after the first (which allocates the state), ag and torch taking turns (``_timing.py``).

Memory is measured in a fresh subprocess per framework, the same way for both (``_memory.py``):
the peak resident set during one step after the first, minus the resident set before it: what a
step allocates beyond the parameters, grads and state it finds. ag's is also shown by tracemalloc,
and each framework's state bytes (ag's ``state_bytes()``, torch's state tensors' nbytes).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ag  # noqa: E402
import ag.optim  # noqa: E402
from _goals import goal, shown, verdict  # noqa: E402
from _memory import rss_peak_of, run_workers  # noqa: E402
from _timing import take_turns  # noqa: E402
from mlp import machine_lines, print_table  # noqa: E402

MB = 10**6
TIME_GOAL = 1.10  # ag / torch, median step
MEMORY_GOAL = 1.10  # ag / torch, a step's peak RSS growth
OPTIMIZERS = {"SGD momentum": ("SGD", dict(lr=0.01, momentum=0.9)),
              "Adam": ("Adam", dict(lr=1e-3)),
              "AdamW": ("AdamW", dict(lr=1e-3, weight_decay=1e-2))}
LIMITS = {  # what a missed time goal is limited by: the passes each framework makes over a parameter
    "SGD momentum": "NumPy's 4 passes over the parameter (b *= μ, b += g, γ b, θ -= γ b) against torch's 3 "
                    "(mul_, add_, add_ with alpha)",
    "Adam": "NumPy's 12 passes over the parameter, one ufunc a term, against torch's 7, where lerp, addcmul and addcdiv fuse terms",
}
LIMITS["AdamW"] = LIMITS["Adam"]


def make_arrays(width: int, layers: int, dtype, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """An MLP's parameters (weights width × width, biases width) and a grad for each."""
    rng = np.random.default_rng(seed)
    shapes = [(width, width), (width,)] * layers
    values = [rng.standard_normal(s).astype(dtype) for s in shapes]
    return values, [rng.standard_normal(s).astype(dtype) for s in shapes]


def ag_optimizer(name: str, values, grads):
    params = [ag.Tensor(v.copy(), requires_grad=True) for v in values]
    for p, g in zip(params, grads):
        p.grad = g.copy()
    kind, hyper = OPTIMIZERS[name]
    return getattr(ag.optim, kind)(params, **hyper)


def torch_optimizer(name: str, values, grads):
    import torch
    params = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    for p, g in zip(params, grads):
        p.grad = torch.tensor(g.copy())
    kind, hyper = OPTIMIZERS[name]
    return getattr(torch.optim, kind)(params, **hyper)


def torch_state_bytes(optimizer) -> int:
    import torch
    return sum(v.nbytes for s in optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor) and v.ndim > 0)


def memory_worker(framework: str, name: str, width: int, layers: int, dtype: str) -> dict:
    values, grads = make_arrays(width, layers, np.dtype(dtype))
    opt = (ag_optimizer if framework == "ag" else torch_optimizer)(name, values, grads)
    del values, grads
    opt.step()  # the first step allocates the state
    result = {"state": opt.state_bytes() if framework == "ag" else torch_state_bytes(opt)}
    result["rss_peak"], result["rss_after"] = rss_peak_of(opt.step)
    if framework == "ag":
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        opt.step()
        result["tracemalloc_peak"] = tracemalloc.get_traced_memory()[1] - before
        tracemalloc.stop()
    return result


def memory_command(framework: str, name: str, width: int, args) -> tuple[list[str], str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-worker", framework, name,
           "--widths", str(width), "--layers", str(args.layers), "--dtype", args.dtype]
    return cmd, f"{framework} {name} width {width}"


def time_row(name: str, width: int, args) -> list[str]:
    values, grads = make_arrays(width, args.layers, np.dtype(args.dtype))
    a, t = ag_optimizer(name, values, grads), torch_optimizer(name, values, grads)
    a.step(), t.step()  # the state, allocated
    times = take_turns({"ag": a.step, "torch": t.step}, args.repeats)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    ratio = med["ag"] / med["torch"]
    count = sum(v.size for v in values)
    return [name, f"{count / 1e6:.2f}", f"{med['ag'] * 1e3:.2f}", f"{med['torch'] * 1e3:.2f}",
            shown(ratio, TIME_GOAL), verdict(ratio, TIME_GOAL), f"{best['ag'] / best['torch']:.2f}"]


def memory_row(name: str, width: int, args) -> list[str]:
    mem = run_workers({f: memory_command(f, name, width, args) for f in ("ag", "torch")})
    a, t = mem["ag"], mem["torch"]
    ratio = a["rss_peak"] / max(t["rss_peak"], 1)
    largest = width * width * np.dtype(args.dtype).itemsize
    return [name, str(width), f"{largest / MB:.2f}", f"{a['tracemalloc_peak'] / MB:.2f}",
            f"{a['rss_peak'] / MB:.2f}", f"{t['rss_peak'] / MB:.2f}", shown(ratio, MEMORY_GOAL),
            verdict(ratio, MEMORY_GOAL), f"{a['state'] / MB:.1f} / {t['state'] / MB:.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="widths 256 and 1024, 5 repeats")
    parser.add_argument("--widths", default="512,1024,2048")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (ag's step is one NumPy pass a line, on one thread)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--memory-worker", nargs=2, metavar=("FRAMEWORK", "OPTIMIZER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        print(json.dumps(memory_worker(*args.memory_worker, int(args.widths), args.layers, args.dtype)))
        return
    if args.quick:
        args.widths, args.repeats = "256,1024", 5
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    print(f"Optimizer step: {args.layers} x (weight width x width, bias width), {args.dtype}, fixed grads")
    for line in machine_lines():
        print(line)
    print(f"load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    time_rows = [time_row(name, w, args) for w in widths for name in OPTIMIZERS]
    print_table(f"Time per step (median of {args.repeats} after the first; goal: ag/torch <= {TIME_GOAL:.2f})",
                ["optimizer", "M params", "ag ms", "torch ms", "ag/torch", "goal", "best ag/torch"], time_rows)
    memory_rows = [] if args.no_memory else [memory_row(name, w, args) for w in widths for name in OPTIMIZERS]
    if memory_rows:
        print_table(f"Peak memory of a step after the first (RSS growth; goal: ag/torch <= {MEMORY_GOAL:.2f})",
                    ["optimizer", "width", "largest param MB", "ag tracemalloc MB", "ag RSS MB", "torch RSS MB",
                     "ag/torch", "goal", "state MB ag / torch"], memory_rows)
    print()
    for row in time_rows:
        goal(f"{row[0]} step time, {row[1]} M params, ag / torch (median)", float(row[4]), TIME_GOAL,
             limited_by=LIMITS[row[0]])
    for row in memory_rows:
        goal(f"{row[0]} step peak, width {row[1]}, ag / torch (RSS)", float(row[6]), MEMORY_GOAL)


if __name__ == "__main__":
    main()
