"""Rematerialization in ag: checkpoint plans on chains of matmul layers, measured, and against torch.

    python benchmarks/remat.py           # n = 64, batch 4096, width 256: 80 to 95 s on 2 cores
    python benchmarks/remat.py --quick   # n = 16, batch 1024, width 128: about 12 s

1. A chain of ``n`` equal layers ``x = x @ w_k`` (float32; activations 16 times the size of a
   weight) under the plans keep all, sqrt (segment mode) and keep none (tensor mode) of ``ag.remat.plan``:
   the activation peak (tracemalloc over forward + backward, the weights and their grads
   allocated before), the matmuls by phase (``ag.count_ops``) and the time per step.
   Goals: sqrt's peak <= 1/4 of keep all's, and sqrt recomputes at most n matmuls.
2. The same chain in PyTorch eager, without checkpoints and with
   ``torch.utils.checkpoint.checkpoint_sequential`` cut into as many segments as ag's sqrt plan.
   Peak memory is measured the same way for both frameworks, in fresh subprocesses (``_memory.py``).
3. A chain of layers of random widths: ``remat.profile`` it, then, for a sweep of budgets, the
   recomputed FLOPs that ``remat.predict`` gives the optimal, greedy and sqrt plans; the optimal
   plan is also run at a few budgets and its tracemalloc peak set against the budget.

Layer k's output is x_k (as in ``ag.remat``); the loss is ``sum(x_{n-1})`` and the input needs no
grad, so a step without recomputation runs n forward and 2n - 1 backward products. Times are
medians (and bests) of steps that take turns in one process, so that drift in the machine's speed
hits every strategy and both frameworks alike.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ag  # noqa: E402
from _memory import rss_peak_of, run_workers  # noqa: E402
from _timing import take_turns  # noqa: E402
from ag import remat  # noqa: E402
from mlp import machine_lines, print_table  # noqa: E402

MB = 10**6
PEAK_GOAL = 1 / 4  # sqrt's activation peak / keep all's
STRATEGIES = ("keep all", "sqrt", "keep none")


# ---- the chains, the same weights for both frameworks ----

def make_chain(widths: list[int], batch: int, seed: int):
    """Input x (batch, widths[0]) and weights w_k (widths[k], widths[k+1]), float32, scaled by 1/sqrt(fan-in)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, widths[0])).astype(np.float32)
    weights = [(rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
               for a, b in zip(widths[:-1], widths[1:])]
    return x, weights


class AgChain:
    """``x = x @ w_k`` in ag, run through ``remat.sequential`` keeping the outputs a plan lists."""

    def __init__(self, x: np.ndarray, weights: list[np.ndarray]) -> None:
        self.x = ag.Tensor(x)
        self.weights = [ag.Tensor(w, requires_grad=True) for w in weights]
        self.layers = [lambda h, w=w: h @ w for w in self.weights]
        self.n = len(self.layers)

    def step(self, kept: list[int], mode: str = "segment") -> None:
        """Forward and backward of sum(x_{n-1}); the weights' grads accumulate in place."""
        ag.sum(remat.sequential(self.layers, self.x, kept, mode=mode)).backward()

    def strategy_step(self, strategy: str) -> Callable[[], None]:
        kept, mode = remat.plan(self.n, strategy), remat.mode_for(strategy)
        return lambda: self.step(kept, mode)


class TorchChain:
    """The same chain in PyTorch eager: ``torch.nn.Linear`` layers without bias, holding w_k transposed."""

    def __init__(self, x: np.ndarray, weights: list[np.ndarray]) -> None:
        import torch
        self.x = torch.from_numpy(x.copy())
        self.model = torch.nn.Sequential(*[self._linear(torch, w) for w in weights])
        self.layer_calls = 0  # forward hooks fire in checkpoint's recomputation too
        for layer in self.model:
            layer.register_forward_hook(self._count_call)

    @staticmethod
    def _linear(torch, w: np.ndarray):
        layer = torch.nn.Linear(w.shape[0], w.shape[1], bias=False)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(w.T.copy()))
        return layer

    def _count_call(self, module, inputs, output) -> None:
        self.layer_calls += 1

    def step(self, segments: int | None) -> None:
        """Forward and backward of sum(x_{n-1}), checkpointed in ``segments`` segments unless None."""
        from torch.utils.checkpoint import checkpoint_sequential
        if segments is None:
            loss = self.model(self.x).sum()
        else:
            loss = checkpoint_sequential(self.model, segments, self.x, use_reentrant=False).sum()
        loss.backward()  # no name holds the chain's output, so torch frees it once the sum has run


def torch_segments(n: int) -> int:
    """As many segments as ag's sqrt plan cuts the chain into."""
    return len(remat.plan(n, "sqrt")) + 1


def torch_step(chain: TorchChain, strategy: str) -> Callable[[], None]:
    segments = None if strategy == "keep all" else torch_segments(len(chain.model))
    return lambda: chain.step(segments)


# ---- measuring ----

@dataclass
class AgRun:
    """One strategy measured: plan, mode, tracemalloc peak, predicted peak, matmuls by phase."""

    strategy: str
    kept: list[int]
    mode: str
    peak_bytes: int
    predicted: remat.Prediction
    counts: ag.trace.OpCounts


def traced_step(step: Callable[[], None]) -> tuple[int, ag.trace.OpCounts]:
    """(tracemalloc peak, matmuls by phase) of one step."""
    gc.collect()
    ag.trace.start_trace()
    try:
        with ag.count_ops() as counts:
            step()
        peak = ag.trace.snapshot_trace().peak_bytes
    finally:
        ag.trace.end_trace()
    return peak, counts


def measure_ag(chain: AgChain, profile: remat.ChainProfile, strategy: str) -> AgRun:
    kept, mode = remat.plan(chain.n, strategy), remat.mode_for(strategy)
    peak, counts = traced_step(lambda: chain.step(kept, mode))
    return AgRun(strategy, kept, mode, peak, remat.predict(profile, kept, mode=mode), counts)


def memory_worker(framework: str, strategy: str, n: int, batch: int, width: int) -> dict:
    """In a fresh process: RSS peak of one step after a warm-up (weights and grads exist before)."""
    x, weights = make_chain([width] * (n + 1), batch, seed=0)
    if framework == "ag":
        chain = AgChain(x, weights)
        step = chain.strategy_step(strategy)
    else:
        chain = TorchChain(x, weights)
        step = torch_step(chain, strategy)
    del x, weights
    step()  # warm-up: the weights' grads, BLAS buffers, thread pools
    result = {}
    result["rss_peak"], result["rss_after"] = rss_peak_of(step)
    if framework == "ag":
        result["tracemalloc_peak"] = traced_step(step)[0]
    return result


def memory_command(framework: str, strategy: str, args) -> tuple[list[str], str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-worker", framework, strategy,
           "--layers", str(args.layers), "--batch", str(args.batch), "--width", str(args.width)]
    return cmd, f"{framework} {strategy}"


# ---- 1 and 2: the equal chain, ag's strategies and torch ----

def equal_chain(args) -> None:
    n = args.layers
    x, weights = make_chain([args.width] * (n + 1), args.batch, seed=0)
    a, t = AgChain(x, weights), TorchChain(x, weights)
    del x, weights
    profile = remat.profile(a.layers, a.x)
    a.strategy_step("keep all")()  # warm-up: the weights' grads exist from now on
    runs = {s: measure_ag(a, profile, s) for s in STRATEGIES}
    without_output = traced_step(lambda: a.step(list(range(n - 1))))[0]

    steps = {f"ag {s}": a.strategy_step(s) for s in ("keep all", "sqrt")}
    steps |= {f"torch {s}": torch_step(t, s) for s in ("keep all", "sqrt")}
    steps["ag keep none"] = a.strategy_step("keep none")
    torch_calls = {}
    for s in ("keep all", "sqrt"):
        t.layer_calls = 0
        steps[f"torch {s}"]()  # warm-up, and the layers it runs
        torch_calls[s] = t.layer_calls
    repeats = {name: args.repeats for name in steps} | {"ag keep none": args.all_repeats}
    times = take_turns(steps, repeats)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}

    print_ag_table(n, runs, med, best, times)
    print_goals(n, runs, med, best, without_output)
    if not args.no_memory:
        memory = run_workers({(f, s): memory_command(f, s, args)
                              for s in ("keep all", "sqrt") for f in ("ag", "torch")})
        print_torch_table(n, runs, torch_calls, med, best, memory)


def print_ag_table(n: int, runs: dict[str, AgRun], med, best, times) -> None:
    rows = []
    for s, r in runs.items():
        m = r.counts.matmuls
        name = f"ag {s}"
        rows.append([s, r.mode, len(r.kept), f"{r.peak_bytes / MB:.1f}", f"{r.predicted.peak_bytes / MB:.1f}",
                     f"{r.peak_bytes / runs['keep all'].peak_bytes:.3f}", m["forward"], m["recompute"], m["backward"],
                     f"{med[name] * 1e3:.0f}", f"{best[name] * 1e3:.0f}", len(times[name]),
                     f"{med[name] / med['ag keep all']:.2f}"])
    print_table(f"1. ag, {n} layers: activation peak (tracemalloc over forward + backward), matmuls by phase, "
                "time per step",
                ["strategy", "mode", "kept outputs", "peak MB", "predicted MB", "peak / keep all", "forward",
                 "recompute", "backward", "median ms", "best ms", "steps", "time / keep all"], rows)


def print_goals(n: int, runs: dict[str, AgRun], med, best, without_output: int) -> None:
    ratio = runs["sqrt"].peak_bytes / runs["keep all"].peak_bytes
    extra = runs["sqrt"].counts.matmuls["recompute"]
    total = runs["keep all"].counts.total_matmuls
    print(f"\ngoal: sqrt peak <= 1/4 of keep all's: {ratio:.3f} ({runs['sqrt'].peak_bytes / MB:.1f} / "
          f"{runs['keep all'].peak_bytes / MB:.1f} MB): {verdict(ratio <= PEAK_GOAL)}"
          + ("" if ratio <= PEAK_GOAL or n >= 64 else f"; limited by the size: at n = {n} the √n checkpoints and "
             "one segment are a large share of the chain (the goal is set at the default n = 64)"))
    print(f"  plan 'keep all' keeps x_{n - 1} too, which no backward step reads (torch frees it after the sum); "
          f"keeping x_0..x_{n - 2} only: {without_output / MB:.1f} MB, sqrt / that = "
          f"{runs['sqrt'].peak_bytes / without_output:.3f}")
    print(f"goal: sqrt recomputes <= n = {n} matmuls: {extra}: {verdict(extra <= n)}")
    print(f"time overhead of sqrt over keep all: {med['ag sqrt'] / med['ag keep all'] - 1:+.0%} (medians), "
          f"{best['ag sqrt'] / best['ag keep all'] - 1:+.0%} (best steps); {extra} more matmuls on {total} "
          f"is {extra / total:+.0%}")


def verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def print_torch_table(n: int, runs: dict[str, AgRun], torch_calls, med, best, memory) -> None:
    rows = []
    for s in ("keep all", "sqrt"):
        ma, mt = memory[("ag", s)], memory[("torch", s)]
        plan = "no checkpoints" if s == "keep all" else f"checkpoint_sequential, {torch_segments(n)} segments"
        rows.append([s, plan, f"{ma['tracemalloc_peak'] / MB:.1f}", f"{ma['rss_peak'] / MB:.1f}",
                     f"{mt['rss_peak'] / MB:.1f}", f"{ma['rss_peak'] / mt['rss_peak']:.3f}",
                     f"{med[f'ag {s}'] * 1e3:.0f}", f"{med[f'torch {s}'] * 1e3:.0f}",
                     f"{med[f'ag {s}'] / med[f'torch {s}']:.2f}", f"{best[f'ag {s}'] / best[f'torch {s}']:.2f}",
                     f"{runs[s].counts.matmuls['recompute']} / {torch_calls[s] - n}"])
    print_table(f"2. ag against PyTorch eager, same chain: peak RSS growth of one step (fresh subprocess each), "
                "median time per step",
                ["strategy", "torch plan", "ag tracemalloc MB", "ag RSS MB", "torch RSS MB", "ag/torch peak",
                 "ag ms", "torch ms", "ag/torch time", "best ag/torch", "recomputed layers ag / torch"], rows)
    print(MEMORY_METHOD)


MEMORY_METHOD = """
RSS method (as in mlp.py): each framework and strategy in a fresh subprocess with
MALLOC_MMAP_THRESHOLD_=131072, one warm-up step, then VmHWM during one step (reset through
/proc/self/clear_refs) minus VmRSS before it. Weights, input and the weights' grads exist
before the step (grads accumulate in place), so the figure is the step's activations and grads."""


# ---- 3: a chain of random widths, a sweep of budgets ----

def smallest_budget(profile: remat.ChainProfile, low: int, high: int, rel: float = 1e-3) -> int:
    """The least predicted peak of an optimal plan, to within ``rel``: bisect the budget."""
    n = profile.n
    while high - low > rel * high:
        middle = (low + high) // 2
        try:
            remat.plan(n, "optimal", chain=profile, budget_bytes=middle)
            high = middle
        except ValueError:
            low = middle
    return remat.predict(profile, remat.plan(n, "optimal", chain=profile, budget_bytes=high)).peak_bytes


def planned(profile: remat.ChainProfile, strategy: str, budget: int) -> tuple[list[int], remat.Prediction | None]:
    """``strategy``'s plan under ``budget`` and its prediction; ([], None) if no plan fits."""
    try:
        kept = remat.plan(profile.n, strategy, chain=profile, budget_bytes=budget)
    except ValueError:
        return [], None
    cost = remat.predict(profile, kept)
    return (kept, cost) if cost.peak_bytes <= budget else ([], None)


def gflop(p: remat.Prediction | None) -> str:
    return "no plan" if p is None else f"{p.recompute_flops / 1e9:.2f}"


def random_chain(args) -> None:
    n = args.het_layers
    rng = np.random.default_rng(args.seed)
    widths = [int(d) for d in rng.integers(args.min_width, args.max_width + 1, size=n + 1)]
    x, weights = make_chain(widths, args.het_batch, seed=args.seed)
    a = AgChain(x, weights)
    del x, weights
    profile = remat.profile(a.layers, a.x)
    forward = sum(profile.costs)
    none = remat.predict(profile, remat.plan(n, "keep all")).peak_bytes
    tensor_all = remat.predict(profile, [], mode="tensor")
    sqrt = remat.predict(profile, remat.plan(n, "sqrt"))
    start = time.perf_counter()
    least = smallest_budget(profile, tensor_all.peak_bytes, none)
    budgets = [int(b) for b in np.linspace(least, none, args.budgets)]
    rows, optimal = [], {}
    for b in budgets:
        optimal[b], opt = planned(profile, "optimal", b)
        greedy = planned(profile, "greedy", b)[1]
        fits = sqrt.peak_bytes <= b
        rows.append([f"{b / MB:.1f}", f"{b / none:.2f}", len(optimal[b]), f"{opt.peak_bytes / MB:.1f}", gflop(opt),
                     f"{opt.recompute_flops / forward:.0%}", gflop(greedy),
                     gflop(sqrt) if fits else "over budget"])
    planning = time.perf_counter() - start
    print(f"\n3. {n} layers of random widths {args.min_width}..{args.max_width} (seed {args.seed}), "
          f"batch {args.het_batch}, float32: outputs {min(profile.sizes) / MB:.1f} to "
          f"{max(profile.sizes) / MB:.1f} MB, one forward {forward / 1e9:.2f} GFLOP")
    print(f"predicted peaks: keep all {none / MB:.1f} MB; sqrt {sqrt.peak_bytes / MB:.1f} MB "
          f"({sqrt.recompute_flops / 1e9:.2f} GFLOP recomputed); keep none in tensor mode "
          f"{tensor_all.peak_bytes / MB:.1f} MB ({tensor_all.recompute_flops / 1e9:.2f} GFLOP); "
          f"least budget with a segment-mode plan {least / MB:.1f} MB (bisection)")
    print_table(f"Recomputed GFLOP under a budget, from remat.predict (planning all budgets: {planning:.1f} s)",
                ["budget MB", "budget / keep all", "optimal kept", "optimal peak MB", "optimal GFLOP",
                 "optimal / forward", "greedy GFLOP", "sqrt GFLOP"], rows)
    run_optimal(a, profile, [budgets[i] for i in measured_budgets(len(budgets))], optimal)


def measured_budgets(count: int) -> list[int]:
    """The lowest budget, one in the middle, one near the top (not the top: nothing to recompute there)."""
    return sorted({0, count // 2, max(count - 2, 0)})


def run_optimal(a: AgChain, profile: remat.ChainProfile, budgets: list[int], optimal) -> None:
    a.step(remat.plan(a.n, "keep all"))  # warm-up: the weights' grads exist from now on
    largest_weight = max(w.nbytes for w in a.weights)
    rows = []
    for b in budgets:
        kept = optimal[b]
        peak, counts = traced_step(lambda: a.step(kept))
        predicted = remat.predict(profile, kept)
        rows.append([f"{b / MB:.1f}", f"{predicted.peak_bytes / MB:.1f}", f"{peak / MB:.1f}",
                     f"{(peak - b) / MB:+.2f}", f"{(peak - predicted.peak_bytes) / MB:+.2f}",
                     "yes" if peak <= b + largest_weight else "NO",
                     f"{predicted.recompute_flops / 1e9:.2f}", f"{counts.flops['recompute'] / 1e9:.2f}"])
    print_table(f"The optimal plan run: tracemalloc peak against its budget (the model leaves out the weight grad "
                f"in flight, at most {largest_weight / MB:.2f} MB here)",
                ["budget MB", "predicted MB", "measured MB", "measured - budget MB", "measured - predicted MB",
                 "within budget + one weight", "predicted GFLOP", "measured recompute GFLOP"], rows)


# ---- main ----

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="16 layers of batch 1024, width 128; 12 random layers of batch 512")
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--all-repeats", type=int, default=3, help="timed steps of 'keep none' (quadratic recompute)")
    parser.add_argument("--het-layers", type=int, default=40)
    parser.add_argument("--het-batch", type=int, default=2048)
    parser.add_argument("--min-width", type=int, default=64)
    parser.add_argument("--max-width", type=int, default=512)
    parser.add_argument("--budgets", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-memory", action="store_true", help="skip the RSS subprocesses")
    parser.add_argument("--memory-worker", nargs=2, metavar=("FRAMEWORK", "STRATEGY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        print(json.dumps(memory_worker(*args.memory_worker, args.layers, args.batch, args.width)))
        return
    if args.quick:
        args.layers, args.batch, args.width, args.repeats, args.all_repeats = 16, 1024, 128, 3, 1
        args.het_layers, args.het_batch, args.max_width = 12, 512, 256
    started = time.perf_counter()
    activation, weight = args.batch * args.width * 4, args.width * args.width * 4
    print(f"Rematerialization: {args.layers} layers of x = x @ w_k, batch {args.batch}, width {args.width}, "
          f"float32 (an activation {activation / MB:.1f} MB, a weight {weight / MB:.2f} MB); "
          f"loss = sum(x_{{n-1}}), forward + backward; sqrt keeps every {math.isqrt(args.layers)}-th output")
    for line in machine_lines():
        print(line)
    print(f"load average before the run: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    equal_chain(args)
    random_chain(args)
    print(f"\nload average after the run: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"the run took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
