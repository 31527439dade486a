"""Rematerialization on graphs: how far HiGHS gets with Checkmate's MILP, how far CP-SAT gets with
Moccasin's intervals beside it, and what each schedule costs on a 2-layer transformer next to
PyTorch's own checkpointing.

    python benchmarks/remat_solver.py            # parts 1 and 2: 20 to 200 nodes, 60 s per solve: about 12 min
    python benchmarks/remat_solver.py --quick    # 20 and 50 nodes, 10 s per solve: about 2 min
    python benchmarks/remat_solver.py --part 3   # both solvers on every graph: hours on 2 cores
    python benchmarks/remat_solver.py --part 3 --graphs mlp101 transformer4   # a few rows

Part 3, the two solvers side by side. Graphs: residual MLPs of 20 to 500 nodes (batch 64,
width 64), the U-Net, and transformers of 1, 2, 4 and 8 layers (``examples.transformer``'s
defaults); for each, 5 budgets evenly from ``lower_bound_bytes`` to the no-remat peak. Per
solver: the seconds it took (to a proof, or to its limit: 60 s, 300 s for 8 layers), its
recompute, and the gap to the best lower bound either solver proved, the covering bound
(``recompute_lower_bound``) included (0: proved optimal).
Moccasin runs with 2 intervals; its "C-opt" says CP-SAT proved the optimum among schedules
computing no node more than twice. "exec/pred" is each schedule's peak as ``execute`` measures it
over the model's prediction (MILP's / CP-SAT's). Goals: 100-node graphs proved optimal within 60 s
at every budget; a 4-layer transformer within 60 s; an 8-layer one within 300 s with a gap <= 5%;
every schedule's measured peak within 5% of its prediction.

Part 1, the solver. Residual MLPs of 6 to 66 blocks (20 to 200 nodes, 3 per block and a loss),
each at the budget a fifth of the way from ``lower_bound_bytes`` to the no-recompute peak. For each:
the MILP's size, HiGHS' time, status and gap under the time limit, its recompute; LP rounding's
time and recompute at the same budget; and the best fixed plan that fits. Goal: HiGHS proves
optimality within the limit up to some size; the table says where it stops (reported, not a
pass/fail: Checkmate's paper needed a commercial solver and hours for its largest graphs).

Part 2, the transformer. ``ag.remat.examples.transformer(layers=2)`` without dropout (so that torch
can hold the same model), s=256, b=2, h=128, a=4, float32. ag: every schedule run by
``ag.remat.execute`` (no plan, NeMo's selective and full, Checkmate at selective's budget, DTR at
the same budget); torch: the same model (``benchmarks/transformer.py``'s twin) with no
checkpoints, ``checkpoint(layer, use_reentrant=False)`` per layer, ``checkpoint`` around the
attention core, and the selective-checkpoint policy (``create_selective_checkpoint_contexts``:
save every matmul's output, recompute the rest) around each layer. Peak: RSS growth during one
step in a fresh process per contestant (``_memory.py``: every large array mapped and unmapped, so
RSS follows live bytes) for both, and tracemalloc's peak for ag. Time: the median of steps taking
turns in one process. Goal, per
mode where both have one: ag's peak ≤ 1.10 × torch's (the transformer benchmark's goal).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _memory import rss_peak_of, run_workers  # noqa: E402
from _goals import shown, verdict  # noqa: E402
from mlp import machine_lines, print_table  # noqa: E402
from transformer import torch_model  # noqa: E402

from ag import remat  # noqa: E402
from ag.remat import examples  # noqa: E402
from ag.remat.graphs.checkmate import NoScheduleFits, _Program  # noqa: E402

MB = 10**6

GRAPHS = {f"mlp{3 * b + 2}": (lambda b=b: examples.residual_mlp(blocks=b, batch=64, width=64))
          for b in (6, 16, 33, 66, 166)}
GRAPHS["unet"] = examples.unet
GRAPHS.update({f"transformer{k}": (lambda k=k: examples.transformer(layers=k)) for k in (1, 2, 4, 8)})


def side_by_side(names: list[str], time_limit: float, which=range(5), intervals: int = 2) -> tuple[list[list[str]], list[str]]:
    """Part 3's rows, one per graph and budget (``which`` of the 5), and its goal lines."""
    rows, proved, ratios = [], {}, []
    for name in names:
        graph = remat.capture(*_captured(name))
        limit = 5 * time_limit if name == "transformer8" else time_limit
        floor = remat.lower_bound_bytes(graph)
        none = remat.chain_schedule(graph, "keep all").predicted_peak_bytes
        for budget in np.linspace(floor, none, 5).astype(int)[list(which)]:
            milp = _timed(remat.checkmate, graph, int(budget), time_limit=limit)
            cp = _timed(remat.moccasin, graph, int(budget), time_limit=limit, intervals=intervals)
            bound = max((s.lower_bound or 0.0 for s, _ in (milp, cp) if isinstance(s, remat.Schedule)), default=0.0)
            cells = [_cells(found, seconds, bound) for found, seconds in (milp, cp)]
            proved.setdefault(name, []).append((cells[0][3], cells[1][3]))
            measured = [_measured_over_predicted(found) for found, _ in (milp, cp)]
            ratios += [r for r in measured if r is not None]
            rows.append([name, str(graph.n), f"{budget / MB:.2f}", *cells[0][:3], *cells[1][:3],
                         _c_opt(cp[0]), "/".join("-" if r is None else f"{r:.3f}" for r in measured)])
            print("  " + " | ".join(rows[-1]), flush=True)
    return rows, _solver_goals(proved, time_limit) + _execute_goal(ratios)


def _captured(name: str):
    fn, inputs = GRAPHS[name]()
    return (fn, *inputs)


def _timed(solver, graph, budget: int, **options):
    start = time.perf_counter()
    try:
        found = solver(graph, budget, **options)
    except NoScheduleFits as proof:
        found = proof
    except (ValueError, TimeoutError):
        found = None
    return found, time.perf_counter() - start


def _cells(found, seconds: float, bound: float) -> list:
    """(seconds, recompute in MFLOP, gap to ``bound``, the gap as a number: 1 when nothing was found).
    A proof that no schedule fits is a solved row; one among C-interval schedules only is not."""
    if isinstance(found, NoScheduleFits):
        if found.intervals is None:
            return [f"{seconds:.1f}", "infeasible", "proved", 0.0]
        return [f"{seconds:.1f}", f"none with C={found.intervals}", "proved", 1.0]
    if found is None:
        return [f"{seconds:.1f}", "none", "-", 1.0]
    spent = found.recompute_flops
    gap = 0.0 if spent == 0 or found.status == "optimal" else (spent - min(bound, spent)) / spent
    return [f"{seconds:.1f}", f"{spent / 1e6:,.1f}", f"{gap:.0%}", gap]


def _measured_over_predicted(found) -> float | None:
    """``execute``'s peak over the model's prediction, for a schedule (None for anything else)."""
    if not isinstance(found, remat.Schedule):
        return None
    return remat.execute(found).peak_bytes / found.predicted_peak_bytes


def _execute_goal(ratios: list[float]) -> list[str]:
    if not ratios:
        return ["goal: execute's peak within 5% of the prediction: no schedule run"]
    worst = max(ratios, key=lambda r: abs(r - 1))
    return [f"goal: execute's peak within 5% of the prediction on all {len(ratios)} schedules: worst "
            f"{worst:.3f}: {'met' if abs(worst - 1) <= 0.05 else 'missed'}"]


def _c_opt(found) -> str:
    """"yes" when CP-SAT proved its schedule optimal among C-interval ones, else who made it."""
    if not isinstance(found, remat.Schedule):
        return "-"
    if found.proved_within_intervals:
        return "yes"
    return "no" if found.found_by == "CP-SAT" else found.found_by.replace("warm start", "no: warm")


def _solver_goals(proved: dict, time_limit: float) -> list[str]:
    """The issue's goals, from the rows measured (a graph not run says so)."""
    lines = []
    for name, what, limit, gap in (("mlp101", "100-node graph proved optimal at every budget", time_limit, 0.0),
                                   ("transformer4", "4-layer transformer proved optimal at every budget",
                                    time_limit, 0.0),
                                   ("transformer8", "8-layer transformer within 5% at every budget",
                                    5 * time_limit, 0.05)):
        if len(proved.get(name, ())) < 5:
            lines.append(f"goal: {what} within {limit:g} s: not run at every budget")
            continue
        best = [min(m, c) for m, c in proved[name]]
        met = all(g <= gap for g in best)  # each solver stops at its limit: a gap reached is reached within it
        lines.append(f"goal: {what} within {limit:g} s (either solver): worst gap {max(best):.0%}: "
                     f"{'met' if met else 'missed'}")
    return lines


def solver_rows(blocks: list[int], time_limit: float) -> list[list[str]]:
    rows = []
    for n_blocks in blocks:
        fn, inputs = examples.residual_mlp(blocks=n_blocks, batch=64, width=64)
        graph = remat.capture(fn, *inputs)
        none = remat.chain_schedule(graph, "keep all")
        floor = remat.lower_bound_bytes(graph)
        budget = floor + (none.predicted_peak_bytes - floor) // 5
        from scipy import sparse
        program = _Program(graph, budget)
        *_, A, _, _ = program.build(sparse)
        milp = _solve(graph, budget, time_limit, relax=False)
        lp = _solve(graph, budget, time_limit, relax=True)
        fixed = [s for s in (remat.chain_schedule(graph, k) for k in ("keep all", "sqrt", "keep none"))
                 if s.predicted_peak_bytes <= budget]
        best_fixed = min((s.recompute_flops for s in fixed), default=None)
        rows.append([str(graph.n), str(graph.stages), f"{program.count:,}", f"{A.shape[0]:,}",
                     milp["seconds"], milp["status"], milp["gap"], milp["flops"],
                     lp["seconds"], lp["flops"], "-" if best_fixed is None else f"{best_fixed / 1e6:,.1f}"])
    return rows


def _solve(graph, budget: int, time_limit: float, relax: bool) -> dict:
    start = time.perf_counter()
    try:
        s = remat.checkmate(graph, budget, time_limit=time_limit, relax=relax)
    except (ValueError, TimeoutError) as error:
        return {"seconds": f"{time.perf_counter() - start:.1f}", "status": type(error).__name__, "gap": "-",
                "flops": "-"}
    return {"seconds": f"{time.perf_counter() - start:.1f}", "status": s.status,
            "gap": "-" if s.gap is None else f"{s.gap:.0%}", "flops": f"{s.recompute_flops / 1e6:,.1f}"}


# ---- part 2: the transformer, ag's schedules against torch's checkpointing ----

S, B, H, A = 256, 2, 128, 4


class AgSchedule:
    def __init__(self, graph, schedule, leaves) -> None:
        self.graph, self.schedule, self.leaves = graph, schedule, leaves

    def __call__(self) -> None:
        for t in self.leaves:
            t.grad = None
        remat.execute(self.schedule, trace_memory=False)


class AgDTR(AgSchedule):
    def __call__(self) -> None:
        for t in self.leaves:
            t.grad = None
        remat.dynamic(self.graph, self.schedule)  # here ``schedule`` is the budget


def torch_steps(model, x: np.ndarray, modes=("none", "full", "selective", "policy")) -> dict:
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
    saved = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    steps = {}
    for mode in modes:
        stack = torch_model(model, "none" if mode == "policy" else mode, dropout=0.0)
        if mode == "policy":
            context = functools.partial(create_selective_checkpoint_contexts, policy)
            layers = list(stack.layers)
            stack.forward = lambda h, layers=layers: _policy_forward(layers, h, checkpoint, context)
        tx = torch.from_numpy(x.copy()).requires_grad_()

        def step(stack=stack, tx=tx) -> None:
            stack.zero_grad(set_to_none=True)
            tx.grad = None
            stack(tx).sum().backward()
        steps[mode] = step
    return steps


def _policy_forward(layers, h, checkpoint, context):
    for layer in layers:
        h = checkpoint(layer, h, use_reentrant=False, context_fn=context)
    return h


def transformer_setup(time_limit: float | None, saved: str | None, only: str | None = None):
    """The graph, its schedules (Checkmate's solved here, or loaded from ``saved``) and the contestants
    (``only``: just that one, for a memory worker: one of ag's never imports torch, which takes 3.6 s
    on a Zen 3 core, and one of torch's builds its own mode only)."""
    fn, inputs = examples.transformer(layers=2, s=S, b=B, h=H, a=A, dropout=0.0)
    graph = remat.capture(fn, *inputs)
    selective = remat.nemo(graph, "selective")
    schedules = {"none": remat.chain_schedule(graph, "keep all"), "selective": selective,
                 "full": remat.nemo(graph, "full")}
    if saved is None:
        schedules["checkmate"] = remat.checkmate(graph, selective.predicted_peak_bytes, time_limit=time_limit)
    else:
        matrices = np.load(saved)
        schedules["checkmate"] = remat.Schedule(graph, matrices["R"], matrices["S"], "checkmate")
    steps = {f"ag {name}": AgSchedule(graph, s, fn.parameters) for name, s in schedules.items()}
    steps["ag DTR"] = AgDTR(graph, selective.predicted_peak_bytes, fn.parameters)
    if only is None or only.startswith("torch"):
        modes = (only.split()[1],) if only else ("none", "full", "selective", "policy")
        steps.update({f"torch {k}": v for k, v in torch_steps(fn.model, inputs[0].value, modes).items()})
    return graph, schedules, steps


def memory_worker(name: str, saved: str) -> None:
    """In a fresh process (``_memory.run_worker``): one warm-up step, then the RSS growth of one step."""
    _, _, steps = transformer_setup(None, saved, only=name)
    step = steps[name]
    step()
    print(json.dumps({"rss_peak": rss_peak_of(step)[0]}))


def transformer_rows(time_limit: float, repeats: int) -> tuple[list[list[str]], list[str]]:
    graph, schedules, contestants = transformer_setup(time_limit, None)
    selective = schedules["selective"]
    tracemalloc_peak = {f"ag {name}": remat.execute(s).peak_bytes for name, s in schedules.items()}
    tracemalloc_peak["ag DTR"] = remat.dynamic(graph, selective.predicted_peak_bytes).peak_bytes
    with tempfile.TemporaryDirectory() as folder:
        saved = os.path.join(folder, "checkmate.npz")
        np.savez(saved, R=schedules["checkmate"].R, S=schedules["checkmate"].S)
        workers = run_workers({name: ([sys.executable, os.path.abspath(__file__), "--memory-worker", name,
                                       "--schedules", saved], name) for name in contestants})
        rss = {name: result["rss_peak"] for name, result in workers.items()}
    for step in contestants.values():
        step()  # warm-up: BLAS buffers, torch's first-call work
    times = {name: [] for name in contestants}
    for _ in range(repeats):
        for name, step in contestants.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    rows, goals = [], []
    peers = {"ag none": "torch none", "ag selective": "torch selective", "ag full": "torch full",
             "ag checkmate": "torch policy"}
    for name in contestants:
        ms = statistics.median(times[name]) * 1e3
        ratio = "-"
        if name in peers:
            r = rss[name] / rss[peers[name]]
            ratio = shown(r, 1.10)
            goals.append(f"goal: {name} peak / {peers[name]} peak = {ratio} (goal <= 1.1): {verdict(r, 1.10)}")
        s = schedules.get(name.removeprefix("ag "))
        rows.append([name, f"{tracemalloc_peak[name] / MB:.2f}" if name in tracemalloc_peak else "-",
                     f"{rss[name] / MB:.2f}", "-" if s is None or name.startswith("torch") else
                     f"{s.recompute_flops / 1e6:,.1f}", f"{ms:.1f}", ratio])
    found = schedules["checkmate"]
    goals.append(f"goal: checkmate at selective's budget: {found.status}, recompute {found.recompute_flops:,} "
                 f"≤ selective's {selective.recompute_flops:,}: "
                 f"{'met' if found.recompute_flops <= selective.recompute_flops else 'missed'}")
    return rows, goals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 and 50 nodes, 10 s per solve")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds per solve (default 60, quick 10)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per contestant (default 5)")
    parser.add_argument("--part", choices=("1", "2", "3", "all"), default="all",
                        help="which part (default all: 1 and 2; 3 is long)")
    parser.add_argument("--graphs", nargs="+", choices=sorted(GRAPHS), default=sorted(GRAPHS, key=list(GRAPHS).index),
                        help="part 3's graphs (default all)")
    parser.add_argument("--intervals", type=int, default=2, help="Moccasin's C in part 3 (default 2)")
    parser.add_argument("--budgets", nargs="+", type=int, choices=range(5), default=list(range(5)),
                        help="part 3's budgets, 0 (the lower bound) to 4 (the no-remat peak); default all")
    parser.add_argument("--memory-worker", metavar="CONTESTANT", help=argparse.SUPPRESS)
    parser.add_argument("--schedules", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        memory_worker(args.memory_worker, args.schedules)
        return
    limit = args.time_limit or (10.0 if args.quick else 60.0)
    blocks = [6, 16] if args.quick else [6, 16, 33, 50, 66]
    if args.part == "3":
        print("\n".join(machine_lines()))
        print(f"ag remat: Checkmate's MILP (scipy's HiGHS) beside Moccasin (OR-Tools' CP-SAT, {args.intervals} "
              "intervals), "
              f"time limit {limit:g} s per solve ({5 * limit:g} s for 8 layers)")
        rows, goals = side_by_side(args.graphs, limit, args.budgets, args.intervals)
        print_table("Part 3: both solvers on each graph at 5 budgets from the lower bound to the no-remat peak "
                    "(budget in MB, recompute in MFLOP, gap to the best bound either proved)",
                    ["graph", "nodes", "budget", "MILP s", "MILP recompute", "MILP gap", "CP-SAT s",
                     "CP-SAT recompute", "CP-SAT gap", "C-opt", "exec/pred"], rows)
        print()
        for line in goals:
            print(line)
        return
    if args.part != "2":
        print("\n".join(machine_lines()))
        print(f"ag remat: Checkmate's MILP on scipy's HiGHS, time limit {limit:g} s per solve")
        print_table("Part 1: the MILP against graph size (residual MLPs, budget a fifth of the way from the floor "
                    "to the no-recompute peak; recompute in MFLOP)",
                    ["nodes", "stages", "variables", "constraints", "MILP s", "status", "gap", "MILP recompute",
                     "LP s", "LP-rounding recompute", "best fixed plan"], solver_rows(blocks, limit))
        sys.stdout.flush()
    if args.part != "1":
        rows, goals = transformer_rows(limit, args.repeats)
        print_table(f"Part 2: a 2-layer transformer (s={S}, b={B}, h={H}, a={A}, float32, no dropout), one step "
                    "(peaks in MB, recompute in MFLOP, time in ms)",
                    ["schedule", "tracemalloc peak", "RSS peak", "recompute", "median ms", "ag / torch peak"], rows)
        print()
        for line in goals:
            print(line)


if __name__ == "__main__":
    main()
