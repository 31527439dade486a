"""Attention on the CPU: ag's FlashAttention-2 on NumPy against ag's naive attention and torch SDPA.

    python benchmarks/attention.py           # B=1, H=8, d=64, N = 1024..8192, float32: about 6 min on 2 cores
    python benchmarks/attention.py --quick   # N = 256..1024, sweep at 512 and 1024: about 35 s
    python benchmarks/attention.py --block-q 256 --block-k 256 --skip sweep,memory   # other tiles than ag's defaults
    python benchmarks/attention.py --heads 1 --skip sweep,memory,anatomy   # one head: query tiles shared out
    python benchmarks/attention.py --q-scale 16 --sizes 2048 --skip sweep,memory,anatomy   # peaked scores

q, k, v and a fixed dO are float32 of shape (B, H, N, d), standard normal; causal is top-left.
The three contestants:

- ag ``flash_attention`` (``ag/attention/``: FlashAttention-2's tiles; with the lab on, a few heads a
  run on its threads, ``ag/lab/sharing.py``);
- ag ``naive_attention`` (S = QKᵀ and P = softmax(S) materialized by ag ops), with
  ``ag.release_unneeded`` after it, as in ``mlp.py``, so that only what backward reads is kept;
- ``torch.nn.functional.scaled_dot_product_attention`` on the CPU (its fused flash kernel).

1. Tile sweep: flash's forward + backward step for block_q × block_k in 64..1024 at N = 2048 (both
   masks), then the fastest two and ag's defaults again at N = 4096; ranked by the best of a few steps,
   the one least disturbed by other processes. ``--sweep-pairs 128x256,256x256 --sweep-n 4096
   --sweep-repeats 10`` compares a few tile sizes with more steps.
2. Time: the forward pass alone (no graph), and one training step, forward + backward of
   loss = sum(O ∘ dO). Medians and bests of runs that take turns in one process, so that drift in
   the machine's speed hits every contestant alike. GFLOP/s with the standard count: 4·B·H·N²·d for
   the forward, 2.5 times that for the backward (3.5 times for the step), halved when causal.
   Goals in the lab: flash <= 1.3 × naive and flash <= 1.2 × torch (stretch: <= 1.0), in time on
   every row (flash runs with its default workers, the cores it may run on, BLAS at one thread
   each). With ``--classroom`` (issue 49): flash <= 2.0 × torch on every row, and flash faster than
   naive (<= 1.0 ×) on the rows from N = 1024, forward and step (flash on one thread, BLAS held to
   one; naive's products and torch on their libraries' threads). Then (2c) one head on one thread
   at the worst forward row's N, forward and step: flash, its products alone by NumPy's BLAS (on the
   classroom path S and dP in float64, as its tiles take them, and all in float32 beside them) and
   by torch's matmul on the same tiles, and torch SDPA; a missed goal names its limit from it.
3. Peak memory of one step at the largest N: tracemalloc for both ag paths, and for all three the
   growth of the resident set in a fresh subprocess (``_memory.py``). Goal, on either path: flash <=
   naive / 10 (set at N = 8192).
4. Where flash's time goes: each NumPy call of one forward and one backward tile step, timed
   alone on one thread as ag writes it, on the heads one run holds, and with the in-place form
   next to it, scaled to a whole pass.
5. Variants and decoding against torch SDPA (``attention_variants.py``): window, softcap, ALiBi and
   dropout steps, dropout's stored mask in bytes, and ``flash_decode``'s bandwidth on decode shapes.
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
import timeit
from dataclasses import dataclass
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ag  # noqa: E402
from _memory import rss_peak_of, run_workers  # noqa: E402
from ag import attention  # noqa: E402
from ag.lab import flash as lab_flash, flash_tiles, sharing  # noqa: E402
from ag.lab import seams  # noqa: E402
from ag.ops.kernels import KERNELS  # noqa: E402
from ag.attention.shapes import visible_keys  # noqa: E402
from ag.attention import flash_attention, naive_attention  # noqa: E402
from ag.attention.flash import DEFAULT_BLOCK_Q_BACKWARD  # noqa: E402
from _timing import take_turns  # noqa: E402
from _goals import goal, shown, verdict  # noqa: E402
from mlp import busy_limit, classroom, in_lab, machine_lines, print_table  # noqa: E402
from _busy import busy_report  # noqa: E402
import attention_variants  # noqa: E402

MB = 10**6
B, H, D = 1, 8, 64
Q_SCALE = 1.0  # q times this (``--q-scale``): scores of this standard deviation, a peaked attention
NAIVE_GOAL = 1.3   # flash time / naive time
TORCH_GOAL = 1.2   # flash time / torch time (issue 14)
TORCH_STRETCH_GOAL = 1.0  # the same issue's stretch goal
MEMORY_GOAL = 0.1  # flash peak / naive peak, either path
CLASSROOM_TORCH_GOAL = 2.0  # flash time / torch time on the classroom path (issue 49)
CLASSROOM_NAIVE_GOAL = 1.0  # flash time / naive time on the classroom path: faster ...
CLASSROOM_NAIVE_FROM = 1024  # ... from this N on
BLOCKS = (64, 128, 256, 512, 1024)
HEAD_REPEATS = 7  # runs of each contestant in table 2c
# Table 2c's wait before each run: every contestant there runs on one thread, and no thread of
# either library is left spinning, which ``_timing.SETTLE``'s 0.2 s waits out (11 s of a --quick run)
HEAD_SETTLE = 0.02
BLAS_PARITY = 1.1  # NumPy's products / torch's matmul above this: the goal line says NumPy's BLAS is slower


# ---- inputs and the three contestants ----

def make_inputs(n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """q, k, v and the fixed output grad dO, float32 (B, H, n, D), standard normal; q times ``Q_SCALE``."""
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((B, H, n, D), dtype=np.float32) for _ in range(4))
    q *= np.float32(Q_SCALE)
    return q, k, v, do


def flops(n: int, causal: bool, passes: float = 1.0) -> float:
    """4·B·H·N²·d per forward (passes = 3.5 for forward + backward), halved when causal."""
    return passes * 4 * B * H * n * n * D / (2 if causal else 1)


class AgAttention:
    """ag's flash or naive attention: a forward on arrays, and a step on Tensors with grads."""

    def __init__(self, fn: Callable, inputs, causal: bool, release: bool = True, **blocks) -> None:
        self.fn, self.causal, self.release, self.blocks = fn, causal, release, blocks
        self.arrays = inputs[:3]
        self.q, self.k, self.v = (ag.Tensor(x, requires_grad=True) for x in inputs[:3])
        self.do = ag.Tensor(inputs[3])

    def forward(self) -> np.ndarray:
        return self.fn(*self.arrays, causal=self.causal, **self.blocks)

    def step_forward(self) -> ag.Tensor:
        """Forward of loss = sum(O ∘ dO) with the graph recorded; the leaves' grads start empty."""
        for t in (self.q, self.k, self.v):
            t.zero_grad()
        o = self.fn(self.q, self.k, self.v, causal=self.causal, **self.blocks)
        if self.release:
            ag.release_unneeded([o], [self.q, self.k, self.v])  # naive: S and its scaled copy go now
        return ag.sum(ag.mul(o, self.do))

    def step(self) -> None:
        self.step_forward().backward()

    def grads(self) -> list[np.ndarray]:
        return [self.q.grad, self.k.grad, self.v.grad]


class TorchAttention:
    """``torch.nn.functional.scaled_dot_product_attention``, the same inputs, the same loss."""

    def __init__(self, inputs, causal: bool) -> None:
        import torch
        self.torch, self.causal = torch, causal
        self.arrays = [torch.from_numpy(x) for x in inputs[:3]]
        self.q, self.k, self.v = (torch.from_numpy(x.copy()).requires_grad_() for x in inputs[:3])
        self.do = torch.from_numpy(inputs[3])

    def forward(self):
        return self.torch.nn.functional.scaled_dot_product_attention(*self.arrays, is_causal=self.causal)

    def step(self) -> None:
        for t in (self.q, self.k, self.v):
            t.grad = None
        o = self.torch.nn.functional.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=self.causal)
        (o * self.do).sum().backward()

    def grads(self) -> list[np.ndarray]:
        return [t.grad.numpy() for t in (self.q, self.k, self.v)]


def contestants(inputs, causal: bool, blocks: dict) -> dict[str, AgAttention | TorchAttention]:
    return {"flash": AgAttention(flash_attention, inputs, causal, **blocks),
            "naive": AgAttention(naive_attention, inputs, causal),
            "torch": TorchAttention(inputs, causal)}


def worst_differences(n: int, blocks: dict) -> dict[tuple[str, bool], float]:
    """Largest relative difference of O and of dQ, dK, dV from naive's, for flash and torch."""
    inputs = make_inputs(n)
    worst = {}
    for causal in (False, True):
        runs = contestants(inputs, causal, blocks)
        for r in runs.values():
            r.step()
        reference = [runs["naive"].forward()] + runs["naive"].grads()
        for name in ("flash", "torch"):
            got = [np.asarray(runs[name].forward())] + runs[name].grads()
            worst[(name, causal)] = max(float(np.max(np.abs(g - w)) / np.max(np.abs(w)))
                                        for g, w in zip(got, reference))
    return worst


# ---- time ----

def tiles_label(blocks: dict, classroom: bool = False) -> str:
    """block_q x block_k, or ag's defaults spelled out where one is None (the classroom's or the lab's)."""
    if None not in blocks.values():
        return f"{blocks['block_q']} x {blocks['block_k']}"
    (fq, fk), (bq, bk) = flash_tiles_of(blocks, classroom, unmasked=True)
    if classroom:
        return f"{fq} x {fk} ({bq} x {bk} in backward)"
    return f"{bq} x {bk} ({fq} x {fk} in a forward without a mask)"


def flash_tiles_of(blocks: dict, classroom: bool, unmasked: bool) -> tuple[tuple[int, int], tuple[int, int]]:
    """(block_q, block_k) of flash's forward and of its backward with these ``blocks`` (None: ag's
    default): the classroom's ``tiled_passes`` (64 query rows in backward) or the lab's (wider tiles
    in a forward without a mask, ``unmasked``)."""
    bq, bk = blocks["block_q"], blocks["block_k"]
    if classroom:
        return ((bq or attention.DEFAULT_BLOCK_Q, bk or attention.DEFAULT_BLOCK_K),
                (bq or DEFAULT_BLOCK_Q_BACKWARD, bk or attention.DEFAULT_BLOCK_K))
    forward = ((bq or lab_flash.DEFAULT_BLOCK_Q_FORWARD_UNMASKED, bk or lab_flash.DEFAULT_BLOCK_K_FORWARD_UNMASKED)
               if unmasked and None in (bq, bk) else (bq or lab_flash.DEFAULT_BLOCK_Q, bk or lab_flash.DEFAULT_BLOCK_K))
    return forward, (bq or lab_flash.DEFAULT_BLOCK_Q, bk or lab_flash.DEFAULT_BLOCK_K)


def timed_step(a: AgAttention) -> tuple[float, float]:
    """(forward, backward) seconds of one training step."""
    gc.collect()
    start = time.perf_counter()
    loss = a.step_forward()
    middle = time.perf_counter()
    loss.backward()
    return middle - start, time.perf_counter() - middle


def med(ts: list[float]) -> float:
    return statistics.median(ts)


# ---- 1. the tile sweep ----

@dataclass(frozen=True)
class TileTime:
    """Seconds of flash's step for one (block_q, block_k): forward and backward of the fastest step
    (the one least disturbed by other processes), and the median step."""

    forward: float
    backward: float
    median: float

    @property
    def best(self) -> float:
        return self.forward + self.backward


def sweep(n: int, causal: bool, pairs: list[tuple[int, int]], repeats: int) -> dict[tuple[int, int], TileTime]:
    inputs = make_inputs(n)
    runs = {pair: AgAttention(flash_attention, inputs, causal, block_q=pair[0], block_k=pair[1]) for pair in pairs}
    AgAttention(flash_attention, make_inputs(256), causal).step()  # warm-up: BLAS threads, NumPy's caches
    times: dict[tuple[int, int], list[tuple[float, float]]] = {pair: [] for pair in pairs}
    for _ in range(repeats):
        for pair, run in runs.items():
            times[pair].append(timed_step(run))
    return {pair: TileTime(*min(ts, key=sum), med([f + b for f, b in ts])) for pair, ts in times.items()}


def ranked(result: dict[tuple[int, int], TileTime]) -> list[tuple[int, int]]:
    return sorted(result, key=lambda pair: result[pair].best)


def print_sweep_grid(n: int, causal: bool, result: dict[tuple[int, int], TileTime], repeats: int) -> None:
    qs, ks = sorted({q for q, _ in result}), sorted({k for _, k in result})
    rows = [[str(q)] + [f"{result[(q, k)].best * 1e3:.0f}" if (q, k) in result else "" for k in ks] for q in qs]
    print_table(f"1. flash step (forward + backward) at N = {n}, {mask_name(causal)}: best ms of {repeats} steps; "
                "rows block_q, columns block_k", ["block_q \\ block_k"] + [str(k) for k in ks], rows)


def print_sweep_ranking(n: int, causal: bool, result: dict[tuple[int, int], TileTime], defaults: tuple[int, int],
                        count: int, repeats: int) -> None:
    order = ranked(result)
    shown = order[:count] + [p for p in [defaults] if p in result and p not in order[:count]]
    fastest = result[order[0]].best
    rows = []
    for pair in shown:
        t = result[pair]
        rows.append([f"{pair[0]} x {pair[1]}", "default" if pair == defaults else "",
                     f"{t.forward * 1e3:.0f}", f"{t.backward * 1e3:.0f}", f"{t.best * 1e3:.0f}",
                     f"{t.median * 1e3:.0f}", f"{flops(n, causal, 1) / t.forward / 1e9:.0f}",
                     f"{flops(n, causal, 2.5) / t.backward / 1e9:.0f}", f"{t.best / fastest:.2f}",
                     f"{H * pair[0] * pair[1] * 4 / MB:.2f}"])
    print_table(f"   N = {n}, {mask_name(causal)}: the fastest {min(count, len(order))} by best of {repeats} steps "
                "(and ag's default)",
                ["block_q x block_k", "", "forward ms", "backward ms", "best step ms", "median step ms",
                 "fwd GFLOP/s", "bwd GFLOP/s", "best / fastest", "S tile MB (H heads)"], rows)


def tile_sweep(args, defaults: tuple[int, int]) -> None:
    """The whole grid at the smaller N, then its fastest few and ag's defaults at the larger N;
    with ``--sweep-pairs``, just those tile sizes at every N of ``--sweep-n``."""
    if args.sweep_pairs:
        for n, repeats in zip(args.sweep_n, args.sweep_repeats):
            for causal in (False, True):
                result = sweep(n, causal, args.sweep_pairs, repeats)
                print_sweep_ranking(n, causal, result, defaults, len(result), repeats)
        return
    n_small, n_large = args.sweep_n
    grid = [(q, k) for q in BLOCKS for k in BLOCKS if q <= n_small and k <= n_small]
    for causal in (False, True):
        result = sweep(n_small, causal, grid, args.sweep_repeats[0])
        print_sweep_grid(n_small, causal, result, args.sweep_repeats[0])
        print_sweep_ranking(n_small, causal, result, defaults, args.sweep_top, args.sweep_repeats[0])
        pairs = list(dict.fromkeys(ranked(result)[:args.sweep_top] + [defaults]))
        large = sweep(n_large, causal, pairs, args.sweep_repeats[1])
        print_sweep_ranking(n_large, causal, large, defaults, len(pairs), args.sweep_repeats[1])


def mask_name(causal: bool) -> str:
    return "causal" if causal else "non-causal"


# ---- 2. time of the forward pass and of the step ----

def repeats_for(n: int, args) -> dict[str, int]:
    """Runs of each contestant at N: fewer for naive at large N (its N×N arrays fault in at ~3 µs per
    4 KiB page on this machine, 1.6 s for one array at N = 8192)."""
    i = args.sizes.index(n)
    return {"flash": args.repeats[i], "torch": args.repeats[i], "naive": args.naive_repeats[i]}


def busy(args, blocks: dict) -> None:
    """``--busy``: flash's step (forward and backward) at each N, both masks, on the classroom path, the
    lab's and torch SDPA's, idle and with one core busy."""
    for n in args.sizes:
        for causal in (False, True):
            inputs = make_inputs(n)
            flash, torch_sdpa = AgAttention(flash_attention, inputs, causal, **blocks), TorchAttention(inputs, causal)
            busy_report(f"flash step, N = {n}, {mask_name(causal)}",
                        {"ag": classroom(flash.step), "ag lab": in_lab(flash.step), "torch": torch_sdpa.step},
                        args.repeats[args.sizes.index(n)], busy_limit(), print_table)


def time_rows(n: int, causal: bool, blocks: dict, args) -> tuple[list[str], list[str]]:
    runs = contestants(make_inputs(n), causal, blocks)
    repeats = repeats_for(n, args)
    calls = {f"{name} forward": r.forward for name, r in runs.items()}
    calls |= {f"{name} step": r.step for name, r in runs.items()}
    times = take_turns(calls, {c: repeats[c.split()[0]] for c in calls})
    del runs
    return (time_row(n, causal, "forward", times, 1.0, args.classroom),
            time_row(n, causal, "step", times, 3.5, args.classroom))


def time_row(n: int, causal: bool, what: str, times: dict, passes: float, classroom: bool = False) -> list[str]:
    """One row of table 2a or 2b; its verdicts against the lab's goals, or the ``classroom``'s."""
    m = {name: med(times[f"{name} {what}"]) for name in ("flash", "naive", "torch")}
    best = {name: min(times[f"{name} {what}"]) for name in ("flash", "naive", "torch")}
    to_naive, to_torch = m["flash"] / m["naive"], m["flash"] / m["torch"]
    runs = "/".join(str(len(times[f"{name} {what}"])) for name in ("flash", "naive", "torch"))
    if classroom:
        judged = n >= CLASSROOM_NAIVE_FROM
        verdicts = [shown(to_naive, CLASSROOM_NAIVE_GOAL) if judged else f"{to_naive:.2f}",
                    verdict(to_naive, CLASSROOM_NAIVE_GOAL) if judged else "-",
                    shown(to_torch, CLASSROOM_TORCH_GOAL), verdict(to_torch, CLASSROOM_TORCH_GOAL)]
    else:
        verdicts = [shown(to_naive, NAIVE_GOAL), verdict(to_naive, NAIVE_GOAL),
                    shown(to_torch, (TORCH_GOAL, TORCH_STRETCH_GOAL)), verdict(to_torch, TORCH_GOAL)]
    return [str(n), mask_name(causal)] + [f"{m[x] * 1e3:.0f}" for x in ("flash", "naive", "torch")] + \
        [f"{flops(n, causal, passes) / m[x] / 1e9:.0f}" for x in ("flash", "naive", "torch")] + verdicts + \
        [f"{best['flash'] / best['naive']:.2f}", f"{best['flash'] / best['torch']:.2f}", runs]


TIME_HEADER = ["N", "mask", "flash ms", "naive ms", "torch ms", "flash GFLOP/s", "naive GFLOP/s", "torch GFLOP/s",
               "flash/naive", f"goal <= {NAIVE_GOAL}", "flash/torch", f"goal <= {TORCH_GOAL:g}",
               "best flash/naive", "best flash/torch", "runs f/n/t"]
CLASSROOM_TIME_HEADER = TIME_HEADER[:9] + [f"goal <= {CLASSROOM_NAIVE_GOAL:g} from N = {CLASSROOM_NAIVE_FROM}",
                                           "flash/torch", f"goal <= {CLASSROOM_TORCH_GOAL:g}"] + TIME_HEADER[12:]


def time_tables(args, blocks: dict) -> None:
    forward_rows, step_rows = [], []
    for n in args.sizes:
        for causal in (False, True):
            forward, step = time_rows(n, causal, blocks, args)
            forward_rows.append(forward)
            step_rows.append(step)
    print_time_tables(forward_rows, step_rows, blocks, args.classroom)
    n = int(max(forward_rows, key=lambda r: float(r[10]))[0])  # the worst forward row's N
    head = one_head(n, blocks, HEAD_REPEATS, args.classroom)
    print_one_head(n, head, args.classroom)
    if args.classroom:
        print_classroom_goals(forward_rows, step_rows, n, head)
    else:
        print_time_goals(forward_rows, step_rows, (torch_limit(n, head), torch_limit(n, head, step=True)))


def print_time_tables(forward_rows: list, step_rows: list, blocks: dict, classroom: bool = False) -> None:
    tiles = f"flash tiles {tiles_label(blocks, classroom)}"
    header = CLASSROOM_TIME_HEADER if classroom else TIME_HEADER
    print_table(f"2a. Forward pass alone (no graph): median ms, GFLOP/s at 4·B·H·N²·d (halved when causal); "
                f"{tiles}",
                header, forward_rows)
    print_table(f"2b. Training step, forward + backward of sum(O ∘ dO): median ms, GFLOP/s at 3.5 × the forward "
                f"count; {tiles}", header, step_rows)


def one_head(n: int, blocks: dict, repeats: int, classroom: bool = False) -> dict[str, float]:
    """Median seconds of one head's non-causal forward, and of its step (forward + backward), at
    N = ``n`` on one thread (NumPy's BLAS and torch both held to one): ag's flash; its products
    alone on the same tiles, by NumPy's BLAS and by torch's matmul (the forward's QKᵀ and PV; the
    backward's QKᵀ, dO Vᵀ, Pᵀ dO, dSᵀ Q and dS K); and torch SDPA. Whatever flash spends beyond its
    products is the work outside BLAS: the passes over each tile, the per-row ops and the Python.
    Keys: "flash", "numpy products", "torch products", "torch", and each with " step"; and "numpy exp"
    and "torch exp", ns an element of the exp a bounded tile takes (``exp_rates``). On the
    ``classroom`` path the tiles are the classroom's, "numpy products" takes S = QKᵀ and dP = dO Vᵀ
    in float64 and rounds them once to float32 as its tiles do (``Tiles.product``), and "float32
    products" (and " step") are the same products all in float32 on NumPy's BLAS."""
    import torch
    from threadpoolctl import threadpool_limits
    inputs = tuple(x[:, :1] for x in make_inputs(n))  # (1, 1, n, d): one head
    q, k, v = inputs[:3]
    forward_tiles, backward_tiles = flash_tiles_of(blocks, classroom, unmasked=True)

    def pairs(tiles):
        (bq, bk) = tiles
        return [(slice(i, i + bq), slice(j, j + bk)) for i in range(0, n, bq) for j in range(0, n, bk)]

    def wide_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """a @ b taken in float64, rounded once to float32 (into ``out``), as the classroom's S and dP."""
        exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
        if out is None:
            return exact.astype(np.float32)
        np.copyto(out, exact)
        return out

    def products(lib, backward: bool, wide: bool = False) -> Callable[[], None]:
        """The forward's products on every tile (S = Q_i K_jᵀ into one buffer, then S V_j), and with
        ``backward`` then the backward's five on its tiles, by ``lib`` (NumPy or torch); ``wide``:
        S and dP in float64 (``wide_matmul``)."""
        matmul = lib.matmul
        scores = wide_matmul if wide else matmul
        q2, k2, v2, do = (lib.from_numpy(a) if lib is not np else a
                          for a in (np.ascontiguousarray(x[0, 0]) for x in inputs))
        buffers = {t: lib.empty((min(t[0], n), min(t[1], n)), dtype=lib.float32) for t in {forward_tiles, backward_tiles}}

        def run() -> None:
            s = buffers[forward_tiles]
            for i, j in pairs(forward_tiles):
                s_ij = scores(q2[i], k2[j].T, out=s[:q2[i].shape[0], :k2[j].shape[0]])
                matmul(s_ij, v2[j])
            if backward:
                s = buffers[backward_tiles]
                for i, j in pairs(backward_tiles):
                    s_ij = scores(q2[i], k2[j].T, out=s[:q2[i].shape[0], :k2[j].shape[0]])
                    dp = scores(do[i], v2[j].T)
                    matmul(s_ij.T, do[i]), matmul(dp.T, q2[i]), matmul(dp, k2[j])
        return run

    sdpa = torch.nn.functional.scaled_dot_product_attention
    tq4, tk4, tv4 = (torch.from_numpy(x) for x in (q, k, v))
    ag_step = AgAttention(flash_attention, inputs, False, **blocks)
    torch_step = TorchAttention(inputs, False)
    calls = {"flash": lambda: flash_attention(q, k, v, **blocks),
             "numpy products": products(np, False, classroom), "torch products": products(torch, False),
             "torch": lambda: sdpa(tq4, tk4, tv4),
             "flash step": ag_step.step, "numpy products step": products(np, True, classroom),
             "torch products step": products(torch, True), "torch step": torch_step.step}
    if classroom:
        calls |= {"float32 products": products(np, False), "float32 products step": products(np, True)}
    threads, workers = torch.get_num_threads(), ag.lab.set_workers(1)
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            times = take_turns(calls, repeats, settle=HEAD_SETTLE)
        result = {name: med(t) for name, t in times.items()}
        result["numpy exp"], result["torch exp"] = exp_rates(base2=not classroom and flash_tiles.EXP2_FAST)
    finally:
        torch.set_num_threads(threads)
        ag.lab.set_workers(workers)
    return result


def exp_rates(size: int = 1 << 18, base2: bool | None = None) -> tuple[float, float]:
    """ns an element of the exp flash takes on a bounded tile (the lab's: exp2 where that is NumPy's
    fast one, ``ag.flash_tiles.EXP2_FAST``, the default of ``base2``; else exp, the classroom's), in
    place on ``size`` float32 scores, by NumPy and by torch, on the calling thread: the pass no
    product hides."""
    import torch
    x = np.random.default_rng(0).standard_normal(size, dtype=np.float32)
    out = np.empty_like(x)
    fast = flash_tiles.EXP2_FAST if base2 is None else base2
    numpy_exp, torch_exp = (np.exp2, torch.exp2) if fast else (np.exp, torch.exp)
    tx, tout = torch.from_numpy(x), torch.from_numpy(out)
    return (best_us(lambda: numpy_exp(x, out=out), 20) * 1e3 / size,
            best_us(lambda: torch_exp(tx, out=tout), 20) * 1e3 / size)


def print_one_head(n: int, head: dict[str, float], classroom: bool = False) -> None:
    rows = []
    for what, key in (("forward", ""), ("forward + backward", " step")):
        ms = {name: head[name + key] * 1e3 for name in ("flash", "numpy products", "torch products", "torch")}
        wide = [f"{head['float32 products' + key] * 1e3:.2f}"] if classroom else []
        rows.append([what, f"{ms['flash']:.2f}", f"{ms['numpy products']:.2f}", *wide, f"{ms['torch products']:.2f}",
                     f"{ms['flash'] - ms['numpy products']:.2f}", f"{ms['torch']:.2f}", f"{ms['flash'] / ms['torch']:.2f}"])
    products = (["its products (NumPy's BLAS; S and dP in float64)", "the same in float32 (NumPy's BLAS)"]
                if classroom else ["its products (NumPy's BLAS)"])
    print_table(f"2c. One head on one thread, non-causal at N = {n} (the worst forward row's N): median ms "
                f"of {HEAD_REPEATS} runs",
                ["pass", "flash", *products, "the same products (torch matmul)",
                 "flash beyond its products", "torch SDPA", "flash / torch SDPA"], rows)
    print(f"   {exp_name(classroom)} on one thread: NumPy {head['numpy exp']:.2f} ns an element, torch "
          f"{head['torch exp']:.2f}")


def exp_name(classroom: bool = False) -> str:
    """The exp a bounded tile takes on this machine, and why."""
    if classroom:
        return "exp (the classroom's, every tile)"
    if flash_tiles.EXP2_FAST:
        return "exp2 (NumPy's is SVML's here: AVX-512 on Linux)"
    return "exp (NumPy's exp2 is not its fast one here: no AVX-512, or not Linux)"


def print_time_goals(forward_rows: list, step_rows: list, torch_limits: tuple[str, str]) -> None:
    """The goal lines; ``torch_limits``: what limits the forward's and the step's flash / torch SDPA."""
    print()
    for what, rows, torch_limited_by in (("forward", forward_rows, torch_limits[0]),
                                         ("forward + backward", step_rows, torch_limits[1])):
        for column, peer, limit, limited_by in ((8, "naive", NAIVE_GOAL, "the exp and max passes over each tile"),
                                                (10, "torch SDPA", TORCH_GOAL, torch_limited_by)):
            worst = max(rows, key=lambda r: float(r[column]))
            goal(f"flash / {peer}, {what}, worst of {len(rows)} rows (N = {worst[0]}, {worst[1]})",
                 float(worst[column]), limit, limited_by=limited_by)
        worst = max(rows, key=lambda r: float(r[10]))
        goal(f"stretch: flash / torch SDPA, {what}, worst of {len(rows)} rows (N = {worst[0]}, {worst[1]})",
             float(worst[10]), TORCH_STRETCH_GOAL, limited_by=torch_limited_by)


def torch_limit(n: int, head: dict[str, float], step: bool = False) -> str:
    """What limits flash against torch SDPA, in the forward or (``step``) forward + backward, from the
    one-head measurement (table 2c) and the BLAS kernels this run had: the products where NumPy's
    BLAS is slower than torch's matmul on the same tiles, else what flash does beyond its products."""
    from mlp import numpy_blas_kernels
    key = " step" if step else ""
    flash, products, torch_products, sdpa = (head[x + key] for x in ("flash", "numpy products", "torch products",
                                                                     "torch"))
    blas = products / torch_products
    beyond = flash - products
    which = ("its seven products a tile (the forward's QK^T and PV; the backward's QK^T, dO V^T, P^T dO, dS^T Q "
             "and dS K, each with K, N or M = d = 64)" if step else
             "its two products (QK^T and PV, sgemm with K = d = 64 or with N = d)")
    exp = (f"by {exp_name()}, {head['numpy exp']:.2f} ns an element against torch's "
           f"{head['torch exp']:.2f}")
    shift = ("with the fixed shift, no max or subtract pass" if KERNELS.flash_passes is lab_flash.fixed_shift_passes
             else "after the row max and the subtract of the running max")
    passes = (f"the forward's exp pass and the backward's over each tile (P = e^(S - L) {exp}; dS = P * (dP - D)), "
              "the adds into dK, dV and dQ" if step else
              f"the exp pass over each tile ({exp}; {shift}) and its row sum")
    limit = (f"one head on one thread (2c, N = {n}{', forward + backward' if step else ''}): flash "
             f"{flash * 1e3:.2f} ms against torch SDPA's {sdpa * 1e3:.2f}; {which} take "
             f"{products * 1e3:.2f} ms, {blas:.2f} x torch's matmul on the same tiles, and the rest "
             f"{beyond * 1e3:.2f} ms ({beyond / sdpa:.0%} of torch SDPA's whole head), where torch SDPA spends "
             f"{(sdpa - torch_products) * 1e3:.2f} ms beyond the same products on torch's matmul (its exp runs "
             f"inside its tile loop, on data its products just wrote): {passes}, which no NumPy "
             "call fuses with the products, the per-row ops and the Python between calls. ")
    if blas > BLAS_PARITY:
        limit += ("NumPy's BLAS is slower than torch's on these tiles alone, yet on an Intel Xeon torch's "
                  "matmul in its place inside flash's loops saved nothing (BENCHMARKS.md, 'What limits'). ")
    else:
        limit += "The products run at torch's speed, so the passes outside them are the limit. "
    limit += ("Two threads add starting them and their turns on the GIL. "
              f"numpy's BLAS kernels: {numpy_blas_kernels()}")
    if os.environ.get("OPENBLAS_CORETYPE"):
        limit += ("; on the AMD EPYC (Zen 5), AVX2 (Haswell) kernels took the products 1.8 x as long as "
                  "OpenBLAS's own pick, AVX-512 (SkylakeX): BENCHMARKS.md")
    return limit


def print_classroom_goals(forward_rows: list, step_rows: list, n: int, head: dict[str, float]) -> None:
    """The classroom's goal lines (issue 49), forward and step: flash / torch SDPA on every row, flash /
    naive on the rows from N = ``CLASSROOM_NAIVE_FROM``; each limit from table 2c (at ``n``, ``head``)."""
    print()
    for what, rows, step in (("forward", forward_rows, False), ("forward + backward", step_rows, True)):
        judged = [r for r in rows if int(r[0]) >= CLASSROOM_NAIVE_FROM]
        if judged:
            worst = max(judged, key=lambda r: float(r[8]))
            goal(f"classroom flash / naive, {what}, worst of {len(judged)} rows from N = {CLASSROOM_NAIVE_FROM} "
                 f"(N = {worst[0]}, {worst[1]})", float(worst[8]), CLASSROOM_NAIVE_GOAL,
                 limited_by=classroom_limit(n, head, step, "naive"))
        else:
            print(f"classroom flash / naive, {what}: no row from N = {CLASSROOM_NAIVE_FROM}, where the goal is set")
        worst = max(rows, key=lambda r: float(r[10]))
        goal(f"classroom flash / torch SDPA, {what}, worst of {len(rows)} rows (N = {worst[0]}, {worst[1]})",
             float(worst[10]), CLASSROOM_TORCH_GOAL, limited_by=classroom_limit(n, head, step, "torch SDPA"))


def classroom_limit(n: int, head: dict[str, float], step: bool, peer: str) -> str:
    """What limits the classroom's flash against ``peer`` ("naive" or "torch SDPA"), in the forward or
    (``step``) forward + backward: the threads each runs on in tables 2a and 2b, and from the one-head
    measurement on one thread (table 2c, ``one_head(..., classroom=True)``) its float64 products and
    the unfused passes outside them."""
    import torch
    from mlp import numpy_blas_threads
    key = " step" if step else ""
    flash, wide, narrow, torch_products, sdpa = (head[x + key] * 1e3 for x in (
        "flash", "numpy products", "float32 products", "torch products", "torch"))
    threads = (f"naive's products on NumPy's BLAS's {numpy_blas_threads()[0]} threads" if peer == "naive" else
               f"torch SDPA on its {torch.get_num_threads()} threads")
    which = "S = QK^T and dP = dO V^T" if step else "S = QK^T"
    passes = "the row max, the subtract, the exp, the row sum, acc's rescaling"
    if step:
        passes += ("; in backward the exp again, D = rowsum(dO * O) in float64, dS = P * (dP - D) and the adds "
                   "into dK, dV and dQ")
    return (f"flash runs on one thread with BLAS held to one, {threads} (2a, 2b); on one thread each "
            f"(2c, N = {n}{', forward + backward' if step else ''}) flash takes {flash:.2f} ms against torch "
            f"SDPA's {sdpa:.2f} ({flash / sdpa:.2f} x): its products {wide:.2f} ms with {which} in float64 for "
            f"float32 inputs (lecture 4.5), {wide / narrow:.2f} x the same products in float32 ({narrow:.2f} ms; "
            f"torch's matmul {torch_products:.2f}), and the rest {flash - wide:.2f} ms, where torch SDPA spends "
            f"{sdpa - torch_products:.2f} beyond the same products: the unfused passes over each tile ({passes}), "
            "a NumPy call each, the casts to float64 and back, and the Python between calls; NumPy's exp takes "
            f"{head['numpy exp']:.2f} ns an element on one thread, torch's {head['torch exp']:.2f}")


# ---- 3. peak memory of one step ----

def memory_worker(framework: str, n: int, causal: bool, blocks: dict) -> dict:
    """In a fresh process: warm up on a small N, then the peak of one step at N (RSS; and tracemalloc for ag)."""
    small, inputs = make_inputs(min(n, 256)), make_inputs(n)
    if framework == "torch":
        TorchAttention(small, causal).step()  # warm-up: thread pools, lazy initialisation
        run = TorchAttention(inputs, causal)
    else:
        fn = flash_attention if framework == "flash" else naive_attention
        options = blocks if framework == "flash" else {}
        AgAttention(fn, small, causal, **options).step()
        run = AgAttention(fn, inputs, causal, **options)
    del small, inputs
    result = {}
    result["rss_peak"], result["rss_after"] = rss_peak_of(run.step)
    if framework != "torch":
        result["tracemalloc_peak"] = traced_peak(run)  # the inputs and dO exist already: not counted
    return result


def memory_command(framework: str, n: int, causal: bool, blocks: dict) -> list[str]:
    """The fresh process that measures one step's memory, with this run's heads and tiles."""
    return [sys.executable, os.path.abspath(__file__), "--memory-worker", framework, str(n), str(int(causal)),
            f"--heads={H}"] + [f"--{name.replace('_', '-')}={size}" for name, size in blocks.items() if size]


def memory_row(n: int, causal: bool, blocks: dict) -> list[str]:
    mem = run_workers({name: (memory_command(name, n, causal, blocks), f"{name} N={n} {mask_name(causal)}")
                       for name in ("flash", "naive", "torch")})
    traced = mem["flash"]["tracemalloc_peak"] / mem["naive"]["tracemalloc_peak"]
    rss = mem["flash"]["rss_peak"] / mem["naive"]["rss_peak"]
    return [str(n), mask_name(causal), f"{H * n * n * 4 / MB:.0f}",
            f"{mem['flash']['tracemalloc_peak'] / MB:.1f}", f"{mem['naive']['tracemalloc_peak'] / MB:.0f}",
            shown(traced, MEMORY_GOAL, digits=4), verdict(traced, MEMORY_GOAL),
            f"{mem['flash']['rss_peak'] / MB:.1f}", f"{mem['naive']['rss_peak'] / MB:.0f}",
            f"{mem['torch']['rss_peak'] / MB:.1f}", shown(rss, MEMORY_GOAL, digits=4), verdict(rss, MEMORY_GOAL),
            f"{mem['flash']['rss_peak'] / mem['torch']['rss_peak']:.2f}"]


def traced_peak(run: AgAttention) -> int:
    gc.collect()
    ag.trace.start_trace()
    try:
        run.step()
        return ag.trace.snapshot_trace().peak_bytes
    finally:
        ag.trace.end_trace()


def print_release_effect(n: int) -> None:
    """naive's tracemalloc peak with and without ag.release_unneeded, in N×N×H arrays."""
    inputs, array = make_inputs(n), H * n * n * 4
    parts = []
    for causal in (False, True):
        with_release, without = (traced_peak(AgAttention(naive_attention, inputs, causal, release=r))
                                 for r in (True, False))
        parts.append(f"{mask_name(causal)} {with_release / array:.2f} with it, {without / array:.2f} without")
    print(f"naive's peak in N×N×H arrays (tracemalloc, N = {n}): " + "; ".join(parts))


def memory_tables(args, blocks: dict) -> None:
    print_memory_table([memory_row(args.sizes[-1], False, blocks)])
    print_release_effect(args.sizes[0])


def print_memory_table(rows: list) -> None:
    print_table(f"3. Peak memory of one step (forward + backward; goal flash <= {MEMORY_GOAL} x naive)",
                ["N", "mask", "one N×N×H array MB", "flash tracemalloc MB", "naive tracemalloc MB", "flash/naive",
                 "goal", "flash RSS MB", "naive RSS MB", "torch RSS MB", "flash/naive (RSS)", "goal (RSS)",
                 "flash/torch (RSS)"], rows)
    print(MEMORY_METHOD)
    for row in rows:
        small = "" if int(row[0]) >= 8192 else (f"the size: at N = {row[0]} the inputs and grads are a large share "
                                                  "of naive's peak (the goal is set at N = 8192)")
        goal(f"flash / naive peak, N = {row[0]} {row[1]} (tracemalloc)", float(row[5]), MEMORY_GOAL, limited_by=small)
        goal(f"flash / naive peak, N = {row[0]} {row[1]} (RSS)", float(row[10]), MEMORY_GOAL, limited_by=small)


MEMORY_METHOD = """
Method: each contestant in a fresh subprocess; q, k, v and dO exist before the step, the grads of
q, k and v are made during it (they count). One warm-up step at N = 256, then the RSS method of
mlp.py (VmHWM during one step, reset through /proc/self/clear_refs, minus VmRSS before it, with
MALLOC_MMAP_THRESHOLD_=131072), then for ag a second step under tracemalloc (ag.trace)."""


# ---- 4. where flash's time goes, one tile at a time ----

def best_us(stmt: Callable[[], object], number: int, repeat: int = 7) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e6


def tile_arrays(block_q: int, block_k: int, heads: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One tile's operands in ag's grouped layout (heads, group = 1, rows, d), as one run holds them,
    scores of a realistic size."""
    rng = np.random.default_rng(seed)

    def a(*shape):
        return rng.standard_normal((heads, 1) + shape, dtype=np.float32)
    t = {"q_i": a(block_q, D), "k_j": a(block_k, D), "v_j": a(block_k, D), "do_i": a(block_q, D),
         "d_i": a(block_q, 1), "acc": a(block_q, D), "dq": a(block_q, D),
         "dk": a(block_k, D), "dv": a(block_k, D)}
    t["s"] = np.matmul(t["q_i"], np.swapaxes(t["k_j"], -1, -2)) / math.sqrt(D)
    t["m"] = np.max(t["s"], axis=-1, keepdims=True)
    t["p"] = np.exp(t["s"] - t["m"])
    t["buf"] = np.empty_like(t["s"])
    t["alpha"] = np.ones_like(t["m"])  # ones: repeated in-place rescaling keeps the values as they are
    t["ones"] = np.ones(block_k, np.float32)
    return t


def run_heads(block_q: int, block_k: int) -> int:
    """The heads one run holds with these tiles (``ag.lab.sharing.plan_runs``, B = 1)."""
    head_bytes = block_q * block_k * np.dtype(np.float32).itemsize
    return sharing.plan_runs((B,), H, head_bytes, workers=1)[0].heads


def anatomy_steps(t: dict, block_q: int, block_k: int) -> list[tuple[str, str, Callable, str, Callable | None]]:
    """(pass, step, as ag writes it, the alternative, its statement): each statement one tile's worth."""
    s, p, buf, scale = t["s"], t["p"], t["buf"], np.float32(1 / math.sqrt(D))
    sw = np.swapaxes
    rows, cols = np.arange(block_q), np.arange(block_k)
    visible = cols[None, :] <= rows[:, None]
    bound = np.where(visible, np.nan, -np.inf).astype(np.float32)  # fmin's: keeps S where visible
    # a bounded tile's exp on this machine (``ag.flash_tiles.EXP2_FAST``), and the other one
    base2 = flash_tiles.EXP2_FAST
    exp, other = ("exp2", "exp") if base2 else ("exp", "exp2")
    exp_fn, other_fn = getattr(np, exp), getattr(np, other)
    other_use = "(a masked or unbounded tile)" if base2 else "(an AVX-512 machine's bounded tile)"

    def ag_mask():
        v = visible_keys(True, rows, cols, block_q, block_k)
        if not v.all():
            buf[..., ~v] = -np.inf

    def ag_mask_check():  # an off-diagonal tile: the mask is built and found all True
        return visible_keys(True, rows + block_k, cols, block_q, block_k).all()

    def inplace_ds():
        dp = np.matmul(t["do_i"], sw(t["v_j"], -1, -2))
        dp -= t["d_i"]
        dp *= p

    def inplace_acc():
        t["acc"] *= t["alpha"]
        t["acc"] += np.matmul(p, t["v_j"])

    return [
        ("fwd+bwd", "S = Q_i K_jᵀ (into one buffer)", lambda: np.matmul(t["q_i"], sw(t["k_j"], -1, -2), out=buf),
         "", None),
        ("fwd+bwd", "S *= scale", lambda: np.multiply(s, scale, out=buf), "scale folded into Q_i (per row of tiles)",
         lambda: None),
        ("fwd", "m_new = max(m_i, rowmax S)", lambda: np.maximum(t["m"], np.fmax.reduce(s, axis=-1, keepdims=True)),
         "", None),
        ("fwd", "P = exp(S - m_new, out=S)", lambda: np.exp(s - t["m"], out=buf), "S -= m; exp(S, out=S)",
         lambda: (np.subtract(s, t["m"], out=buf), np.exp(buf, out=buf))),
        ("fwd", "l_i = α l_i + rowsum P (P times ones)",
         lambda: t["alpha"] * t["m"] + np.matmul(p, t["ones"])[..., None], "", None),
        ("fwd", "acc = α acc + P V_j", lambda: t["alpha"] * t["acc"] + np.matmul(p, t["v_j"]),
         "acc *= α; acc += P V_j", inplace_acc),
        ("fixed", f"default forward: P = {exp}({'log2 e · ' if base2 else ''}S, out=S)", lambda: exp_fn(s, out=buf),
         f"{other}(S, out=S) {other_use}", lambda: other_fn(s, out=buf)),
        ("bwd", f"default backward: S -= L_i; P = {exp}(S, out=S)",
         lambda: (np.subtract(s, t["m"], out=buf), exp_fn(buf, out=buf)),
         f"{other}(S, out=S) {other_use}", lambda: (np.subtract(s, t["m"], out=buf), other_fn(buf, out=buf))),
        ("bwd", "dV_j += Σ_group Pᵀ dO_i", lambda: np.add(t["dv"], np.sum(np.matmul(sw(p, -1, -2), t["do_i"]),
                                                                            axis=-3, keepdims=True), out=t["dv"]),
         "no Σ when group = 1", lambda: np.add(t["dv"], np.matmul(sw(p, -1, -2), t["do_i"]), out=t["dv"])),
        ("bwd", "dS = P ∘ (dO_i V_jᵀ - D_i); dS *= scale",
         lambda: np.multiply(p * (np.matmul(t["do_i"], sw(t["v_j"], -1, -2)) - t["d_i"]), scale, out=buf),
         "dP -= D_i; dP *= P (scale at the end)", inplace_ds),
        ("bwd", "dQ_i += dS K_j", lambda: np.add(t["dq"], np.matmul(p, t["k_j"]), out=t["dq"]), "", None),
        ("bwd", "dK_j += Σ_group dSᵀ Q_i", lambda: np.add(t["dk"], np.sum(np.matmul(sw(p, -1, -2), t["q_i"]),
                                                                           axis=-3, keepdims=True), out=t["dk"]),
         "no Σ when group = 1", lambda: np.add(t["dk"], np.matmul(sw(p, -1, -2), t["q_i"]), out=t["dk"])),
        ("causal", "diagonal tile: S = fmin(S, NaN/-inf tile)", lambda: np.fmin(s, bound, out=buf),
         "S[~visible] = -inf", ag_mask),
        ("causal", "other tiles: build mask, .all()", ag_mask_check, "compare k_start + block_k with q_start",
         lambda: block_k <= block_q),
    ]


def anatomy(n: int, blocks: dict, number: int) -> None:
    block_q, block_k = blocks["block_q"] or attention.DEFAULT_BLOCK_Q, blocks["block_k"] or attention.DEFAULT_BLOCK_K
    heads = run_heads(block_q, block_k)
    t = tile_arrays(block_q, block_k, heads)
    tiles = math.ceil(n / block_q) * math.ceil(n / block_k) * math.ceil(H / heads)  # a pass's tiles, all heads
    rows, totals = [], {"fwd": [0.0, 0.0], "bwd": [0.0, 0.0]}
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=1, user_api="blas"):  # as a worker runs them
        timed = [(phase, step, alternative, best_us(stmt, number),
                  best_us(alt_stmt, number) if alt_stmt is not None else None)
                 for phase, step, stmt, alternative, alt_stmt in anatomy_steps(t, block_q, block_k)]
    for phase, step, alternative, us, alt_us in timed:
        for part in ("fwd", "bwd"):
            if part in phase.split("+"):
                totals[part][0] += us
                totals[part][1] += us if alt_us is None else alt_us
        per_pass = "" if phase == "causal" else f"{us * tiles / 1e3:.0f}"
        rows.append([phase, step, f"{us:.0f}", per_pass, alternative,
                     "" if alt_us is None else f"{alt_us:.0f}", "" if alt_us is None else f"{alt_us / us:.2f}"])
    print_table(f"4. One tile of flash ({block_q} x {block_k}, {heads} of the {H} heads, as one run holds them), each "
                f"NumPy call timed alone on one thread: best µs per tile of {number}-call loops; ms per non-causal "
                f"pass at N = {n} ({tiles} such tiles). fwd: the running max (``tiled_forward``, exercise 4's "
                f"loop); fixed: the lab's forward, which keeps S_ij, P's exp, its row sum and acc += P V_j",
                ["pass", "step as ag writes it", "µs / tile", f"ms at N={n}", "alternative", "µs / tile",
                 "alt / ag"], rows)
    for part, (as_ag, alt) in totals.items():
        measured = flops(n, False, 1 if part == "fwd" else 2.5)
        print(f"   {part}: sum of the steps {as_ag * tiles / 1e3:.0f} ms per pass at N = {n} "
              f"({measured / (as_ag * tiles / 1e6) / 1e9:.0f} GFLOP/s); with the alternatives "
              f"{alt * tiles / 1e3:.0f} ms ({alt / as_ag - 1:+.0%})")


# ---- main ----

def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _pairs(text: str) -> list[tuple[int, int]]:
    return [(int(q), int(k)) for q, k in (pair.split("x") for pair in text.split(","))]


# runs per N when --repeats or --naive-repeats is not given: (up to this N, runs)
REPEATS = ((1024, 15), (2048, 11), (4096, 7), (math.inf, 5))
NAIVE_REPEATS = ((1024, 3), (2048, 2), (math.inf, 1))


def runs_for(n: int, table: tuple[tuple[float, int], ...]) -> int:
    return next(runs for up_to, runs in table if n <= up_to)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N = 256, 512, 1024; sweep at 512 and 1024")
    parser.add_argument("--sizes", type=_ints, default=[1024, 2048, 4096, 8192])
    parser.add_argument("--heads", type=int, default=H,
                        help=f"heads H (default {H}); with fewer than the workers, flash's forward shares query tiles")
    parser.add_argument("--q-scale", type=float, default=Q_SCALE,
                        help="q times this: scores of this standard deviation (peaked attention; the memory "
                             "tables keep 1)")
    parser.add_argument("--block-q", type=int, default=None, help="query rows a tile (default: ag's)")
    parser.add_argument("--block-k", type=int, default=None,
                        help="keys per tile; by default ag's (256, and 512 in a forward without a mask)")
    parser.add_argument("--repeats", type=_ints, default=None,
                        help="runs of flash and torch, per N (default 15 up to N = 1024, 11, 7, then 5 from 8192)")
    parser.add_argument("--naive-repeats", type=_ints, default=None,
                        help="runs of naive, per N (default 3 up to N = 1024, 2 at 2048, then 1)")
    parser.add_argument("--sweep-n", type=_ints, default=[2048, 4096])
    parser.add_argument("--sweep-repeats", type=_ints, default=[2, 2], help="steps of each tile size, per sweep N")
    parser.add_argument("--sweep-top", type=int, default=2)
    parser.add_argument("--sweep-pairs", type=_pairs, default=[], help="e.g. 128x256,256x256: only these tiles")
    parser.add_argument("--anatomy-n", type=int, default=4096)
    parser.add_argument("--anatomy-number", type=int, default=10)
    parser.add_argument("--classroom", action="store_true",
                        help="time the classroom path (the paper's loops, one thread); default: the lab's (ag.lab)")
    parser.add_argument("--fixed-shift", action="store_true",
                        help="the lab with its fixed shift and base-2 backward (ag.lab.flash.fixed_shift_passes)")
    parser.add_argument("--busy", action="store_true",
                        help="only flash's step idle and with one core kept busy, classroom, lab and torch")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: sweep,time,memory,anatomy,variants")
    parser.add_argument("--memory-worker", nargs=3, metavar=("FRAMEWORK", "N", "CAUSAL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.heads < 1:
        parser.error(f"--heads must be a positive number of heads, got {args.heads}")
    if args.classroom and args.fixed_shift:
        parser.error("--fixed-shift is the lab's forward: it cannot run with --classroom")
    if args.quick:
        args.sizes, args.repeats, args.naive_repeats = [256, 512, 1024], [3] * 3, [3] * 3
        args.sweep_n, args.sweep_repeats, args.anatomy_n, args.anatomy_number = [512, 1024], [2, 2], 1024, 5
    if args.repeats is None:
        args.repeats = [runs_for(n, REPEATS) for n in args.sizes]
    if args.naive_repeats is None:
        args.naive_repeats = [runs_for(n, NAIVE_REPEATS) for n in args.sizes]
    if not args.sweep_pairs and len(args.sweep_n) != 2:
        parser.error(f"--sweep-n needs two sizes (the grid's N, then the larger N), got {args.sweep_n}")
    for name, sizes in (("repeats", args.sizes), ("naive_repeats", args.sizes), ("sweep_repeats", args.sweep_n)):
        if len(getattr(args, name)) != len(sizes):
            parser.error(f"--{name.replace('_', '-')} needs one count per size in {sizes}")
    return args


def main() -> None:
    global H, Q_SCALE
    args = parse_args()
    H, Q_SCALE = args.heads, args.q_scale
    blocks = {"block_q": args.block_q, "block_k": args.block_k}
    if args.classroom:  # the memory workers, started later, inherit AG_LAB
        os.environ["AG_LAB"] = "0"
        ag.lab.disable()
    else:
        os.environ["AG_LAB"] = "1"
        ag.lab.enable()
        if args.fixed_shift:
            seams.swap({"flash_passes": lab_flash.fixed_shift_passes})
    if args.memory_worker:
        framework, n, causal = args.memory_worker
        print(json.dumps(memory_worker(framework, int(n), bool(int(causal)), blocks)))
        return
    skip = set(filter(None, args.skip.split(",")))
    started = time.perf_counter()
    print(f"Attention: B={B}, H={H}, d={D}, float32, N in {args.sizes}; flash on "
          f"{'the classroom path' if args.classroom else 'the lab (ag.lab)'}, tiles {tiles_label(blocks, args.classroom)} "
          f"(ag's defaults: {tiles_label({'block_q': None, 'block_k': None}, args.classroom)})"
          + (f"; q x {Q_SCALE:g} (peaked scores)" if Q_SCALE != 1 else ""))
    for line in machine_lines():
        print(line)
    print(f"load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          "(other processes on the machine slow every contestant and add noise)")
    if args.busy:
        busy(args, blocks)
        return
    worst = worst_differences(args.sizes[0], blocks)
    print(f"max relative difference from naive at N = {args.sizes[0]} (O, dQ, dK, dV): " +
          ", ".join(f"{name} {mask_name(c)} {w:.1e}" for (name, c), w in worst.items()))

    parts = {"sweep": lambda: tile_sweep(args, (attention.DEFAULT_BLOCK_Q, attention.DEFAULT_BLOCK_K)),
             "time": lambda: time_tables(args, blocks), "memory": lambda: memory_tables(args, blocks),
             "anatomy": lambda: anatomy(args.anatomy_n, blocks, args.anatomy_number),
             "variants": lambda: attention_variants.main(args.quick)}
    took = {}
    for name, part in parts.items():
        if name not in skip:
            start = time.perf_counter()
            part()
            took[name] = time.perf_counter() - start
    print(f"\nload average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; the run took "
          f"{time.perf_counter() - started:.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()) + ")")


if __name__ == "__main__":
    main()
