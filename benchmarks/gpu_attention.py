"""Attention on the GPU: ag's CUDA kernels against torch SDPA and naive attention on CuPy.

    python benchmarks/gpu_attention.py           # B=4, H=16, d = 64 and 128, N = 1024..16384, both masks
    python benchmarks/gpu_attention.py --quick   # N = 1024 and 2048
    python benchmarks/gpu_attention.py --d 128 --n 4096 8192 --json figures.json

q, k, v and a fixed dO are standard normal, (B, H, N, d); causal is top-left (Nq = Nk, so it is also
bottom-right). The contestants, on the same inputs in the same run:

- ag fp32: ``ag.attention.gpu.forward`` and ``backward`` (``flash_fwd.cu``, ``flash_bwd.cu``), float32;
- torch fp32: ``torch.nn.functional.scaled_dot_product_attention`` on the same float32 arrays (shared
  through DLPack, no copy), with the backend torch picks for float32 (memory-efficient attention);
- ag bf16: ``ag.attention.gpu.forward_bf16`` and ``backward_bf16`` (``flash_fwd_bf16.cu``,
  ``flash_bwd_bf16.cu``, mma.sync on the tensor cores), on the inputs rounded to bfloat16 beforehand;
- torch bf16 flash and torch bf16 cuDNN: SDPA on the same bfloat16 inputs, the backend pinned with
  ``torch.nn.attention.sdpa_kernel`` to FLASH_ATTENTION and to CUDNN_ATTENTION (the backward: flash's);
- naive fp32: S = Q Kᵀ, P = softmax(S) and O = P V materialized with CuPy (left out when S and P
  do not fit in the GPU's free memory).

TFLOP/s with the standard count, the same for every contestant whatever it really computes:
4·B·H·N²·d for the forward, 2.5 times that for the backward, halved when causal. Each time is the
median of ``--trials`` CUDA-event timings of back-to-back calls (about 50 ms each), after a warm-up
call that also compiles ag's kernels. Goals (issue 6): ag fp32 forward >= 0.5 × torch fp32 forward,
ag bf16 forward >= 0.5 × torch's flash backend in bf16.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ag.attention import gpu  # noqa: E402
from mlp import print_table  # noqa: E402

B, H = 4, 16
HEAD_DIMS = (64, 128)
SIZES = (1024, 2048, 4096, 8192, 16384)
FP32_GOAL = 0.5  # ag fp32 forward / torch fp32 forward, in TFLOP/s
BF16_GOAL = 0.5  # ag bf16 forward / torch flash bf16 forward
TRIAL_SECONDS = 0.05


def flops(n: int, d: int, causal: bool, passes: float = 1.0) -> float:
    """4·B·H·N²·d per forward (passes = 2.5 for the backward), halved when causal."""
    return passes * 4 * B * H * n * n * d / (2 if causal else 1)


# ---- timing ----

def seconds_per_call(fn: Callable[[], object], trials: int, torch=None) -> float:
    """Median over trials of CUDA-event time per call, calls back to back; torch's events for torch work."""
    import cupy as cp
    if torch is None:
        clock = (cp.cuda.Event, cp.cuda.get_elapsed_time)
    else:
        clock = (lambda: torch.cuda.Event(enable_timing=True), lambda start, end: start.elapsed_time(end))
    fn()  # warm-up: compiles, autotunes, allocates
    cp.cuda.Device().synchronize()
    once = elapsed(fn, 1, *clock)
    repeats = max(1, int(TRIAL_SECONDS / max(once, 1e-6)))
    return statistics.median(elapsed(fn, repeats, *clock) for _ in range(trials))


def elapsed(fn: Callable[[], object], repeats: int, event: Callable, milliseconds: Callable) -> float:
    """Seconds per call of ``repeats`` calls back to back, between two CUDA events."""
    start, end = event(), event()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return milliseconds(start, end) / 1e3 / repeats


# ---- the contestants ----

class Inputs:
    """q, k, v, dO on the GPU as float32 CuPy arrays, their bfloat16 bits, and torch views of both."""

    def __init__(self, n: int, d: int, seed: int = 0) -> None:
        import cupy as cp
        rng = cp.random.default_rng(seed)
        self.q, self.k, self.v, self.do = (rng.standard_normal((B, H, n, d), dtype=cp.float32) for _ in range(4))
        self.bits = [gpu.to_bfloat16(x) for x in (self.q, self.k, self.v, self.do)]


def ag_contestants(x: Inputs, causal: bool) -> dict[str, Callable[[], object]]:
    import cupy as cp
    o, lse = gpu.forward(x.q, x.k, x.v, causal=causal)
    grads = tuple(cp.empty_like(a) for a in (x.q, x.k, x.v))
    o_bf16, lse_bf16 = gpu.forward_bf16(*x.bits[:3], causal=causal)
    return {
        "ag fp32 fwd": lambda: gpu.forward(x.q, x.k, x.v, causal=causal, out=(o, lse)),
        "ag fp32 bwd": lambda: gpu.backward(x.q, x.k, x.v, o, lse, x.do, causal=causal, out=grads),
        "ag bf16 fwd": lambda: gpu.forward_bf16(*x.bits[:3], causal=causal, out=(o_bf16, lse_bf16)),
        "ag bf16 bwd": lambda: gpu.backward_bf16(*x.bits[:3], o_bf16, lse_bf16, x.bits[3], causal=causal, out=grads),
    }


def torch_contestants(x: Inputs, causal: bool) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """torch SDPA's calls that run here, and {name: why not} for the ones that do not."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False (a CPU build of torch?)")
    except Exception as error:
        reason = f"torch unavailable: {error}"
        return {}, {name: reason for name in ("torch fp32 fwd", "torch fp32 bwd", "torch bf16 flash fwd",
                                                 "torch bf16 flash bwd", "torch bf16 cuDNN fwd")}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v, do = (torch.from_dlpack(a) for a in (x.q, x.k, x.v, x.do))
    qg, kg, vg = (a.detach().clone().requires_grad_() for a in (q, k, v))
    o = sdpa(qg, kg, vg, is_causal=causal)
    q16, k16, v16, do16 = (a.to(torch.bfloat16) for a in (q, k, v, do))
    q16g, k16g, v16g = (a.detach().clone().requires_grad_() for a in (q16, k16, v16))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o16 = sdpa(q16g, k16g, v16g, is_causal=causal)

    def pinned(backend):
        def run():
            with sdpa_kernel(backend):
                return sdpa(q16, k16, v16, is_causal=causal)
        return run

    calls = {
        "torch fp32 fwd": lambda: sdpa(q, k, v, is_causal=causal),
        "torch fp32 bwd": lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True),
        "torch bf16 flash fwd": pinned(SDPBackend.FLASH_ATTENTION),
        "torch bf16 flash bwd": lambda: torch.autograd.grad(o16, (q16g, k16g, v16g), do16, retain_graph=True),
        "torch bf16 cuDNN fwd": pinned(SDPBackend.CUDNN_ATTENTION),
    }
    runs, missing = {}, {}
    for name, call in calls.items():
        try:
            call()
            runs[name] = call
        except Exception as error:  # a backend that does not support this GPU, dtype or size
            missing[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    return runs, missing


def naive_contestant(x: Inputs, causal: bool) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """S, P materialized: needs about three (B, H, N, N) float32 arrays at once."""
    import cupy as cp
    n = x.q.shape[-2]
    need = 3 * B * H * n * n * 4
    free, _ = cp.cuda.runtime.memGetInfo()
    if need > 0.9 * free:
        return {}, {"naive fp32 fwd": f"S and P need {need / 1e9:.0f} GB, {free / 1e9:.0f} GB free"}
    scale = np.float32(1 / math.sqrt(x.q.shape[-1]))
    mask = cp.triu(cp.full((n, n), -cp.inf, dtype=cp.float32), k=1) if causal else None

    def naive():
        s = cp.matmul(x.q, cp.swapaxes(x.k, -1, -2))
        s *= scale
        if mask is not None:
            s += mask
        s -= s.max(axis=-1, keepdims=True)
        p = cp.exp(s, out=s)
        p /= p.sum(axis=-1, keepdims=True)
        return cp.matmul(p, x.v)
    return {"naive fp32 fwd": naive}, {}


# ---- one row of the table ----

def measure(n: int, d: int, causal: bool, trials: int) -> dict[str, float | str]:
    """{contestant: TFLOP/s, or why it did not run}, and the largest relative difference of ag's O from torch's."""
    import cupy as cp
    x = Inputs(n, d)
    runs = ag_contestants(x, causal)
    torch_runs, missing = torch_contestants(x, causal)
    naive_runs, naive_missing = naive_contestant(x, causal)
    runs.update(torch_runs)
    runs.update(naive_runs)
    missing.update(naive_missing)
    torch = sys.modules.get("torch") if torch_runs else None
    result: dict[str, float | str] = dict(missing)
    for name, run in runs.items():
        seconds = seconds_per_call(run, trials, torch if name.startswith("torch") else None)
        result[name] = flops(n, d, causal, 2.5 if name.endswith("bwd") else 1.0) / seconds / 1e12
    if "torch fp32 fwd" in runs:
        ours, theirs = runs["ag fp32 fwd"]()[0], cp.from_dlpack(runs["torch fp32 fwd"]())
        result["max rel diff fp32 O vs torch"] = float(cp.abs(ours - theirs).max() / cp.abs(theirs).max())
    del x, runs, torch_runs, naive_runs
    cp.get_default_memory_pool().free_all_blocks()
    return result


COLUMNS = ["ag fp32 fwd", "torch fp32 fwd", "ag fp32 bwd", "torch fp32 bwd", "ag bf16 fwd", "torch bf16 flash fwd",
           "torch bf16 cuDNN fwd", "ag bf16 bwd", "torch bf16 flash bwd", "naive fp32 fwd"]


def cell(value) -> str:
    return f"{value:.1f}" if isinstance(value, float) else "n/a"


def ratio(result: dict, ours: str, theirs: str) -> float | None:
    a, b = result.get(ours), result.get(theirs)
    return a / b if isinstance(a, float) and isinstance(b, float) else None


def table_row(d: int, causal: bool, n: int, result: dict) -> list[str]:
    fp32, bf16 = ratio(result, "ag fp32 fwd", "torch fp32 fwd"), ratio(result, "ag bf16 fwd", "torch bf16 flash fwd")
    return ([str(d), "causal" if causal else "full", str(n)] + [cell(result.get(c)) for c in COLUMNS]
            + [f"{fp32:.2f} {'met' if fp32 >= FP32_GOAL else 'NOT met'}" if fp32 else "n/a",
               f"{bf16:.2f} {'met' if bf16 >= BF16_GOAL else 'NOT met'}" if bf16 else "n/a",
               f"{r:.2f}" if (r := ratio(result, "ag fp32 bwd", "torch fp32 bwd")) else "n/a",
               f"{r:.2f}" if (r := ratio(result, "ag bf16 bwd", "torch bf16 flash bwd")) else "n/a"])


def print_progress(d: int, causal: bool, n: int, result: dict) -> None:
    figures = ", ".join(f"{name} {value:.3g}" for name, value in result.items() if isinstance(value, float))
    reasons: dict[str, list[str]] = {}
    for name, value in result.items():
        if isinstance(value, str):
            reasons.setdefault(value, []).append(name)
    not_run = "".join(f"; not run: {', '.join(names)} ({why})" for why, names in reasons.items())
    print(f"  d={d} {'causal' if causal else 'full'} N={n}: {figures}{not_run}", flush=True)


def machine_lines() -> list[str]:
    import cupy as cp
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    driver, runtime = cp.cuda.runtime.driverGetVersion(), cp.cuda.runtime.runtimeGetVersion()
    lines = [f"GPU: {name}, sm_{props['major']}{props['minor']}, {props['multiProcessorCount']} SMs, "
             f"{props['totalGlobalMem'] / 2**30:.0f} GiB",
             f"CUDA driver {driver // 1000}.{driver % 1000 // 10}, CuPy {cp.__version__} (CUDA runtime "
             f"{runtime // 1000}.{runtime % 1000 // 10}), numpy {np.__version__}"]
    try:
        import torch
        lines.append(f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()})")
    except ImportError:
        lines.append("torch: not installed")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 1024 and 2048 only")
    parser.add_argument("--n", type=int, nargs="+", default=None, help="sequence lengths (default 1024..16384)")
    parser.add_argument("--d", type=int, nargs="+", default=list(HEAD_DIMS), help="head dims (default 64 128)")
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()
    ok, reason = gpu.available()
    if not ok:
        sys.exit(f"gpu_attention: needs a CUDA GPU with CuPy, and here {reason}")
    sizes = args.n or (SIZES[:2] if args.quick else SIZES)
    masks = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    print("\n".join(machine_lines()))
    print(f"B={B}, H={H}; TFLOP/s = 4·B·H·N²·d (×2.5 backward, ×0.5 causal) / the median of {args.trials} trials")
    rows, figures = [], []
    for d in args.d:
        for causal in masks:
            for n in sizes:
                result = measure(n, d, causal, args.trials)
                figures.append({"d": d, "causal": causal, "n": n, **result})
                rows.append(table_row(d, causal, n, result))
                print_progress(d, causal, n, result)
    print_table("TFLOP/s (n/a: did not run, see the lines above)",
                ["d", "mask", "N"] + COLUMNS + ["ag/torch fp32 fwd (goal >= 0.5)", "ag bf16/torch flash (goal >= 0.5)",
                                                 "ag/torch fp32 bwd", "ag bf16/torch flash bwd"], rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_lines(), "figures": figures}, f, indent=1)


if __name__ == "__main__":
    main()
