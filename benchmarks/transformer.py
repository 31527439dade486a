"""One training step of a 4-layer GPT Transformer (float32): ag against the same model in PyTorch CPU.

    python benchmarks/transformer.py           # s=512, b=4, h=512, a=8: about 3 min on 2 cores (168 s)
    python benchmarks/transformer.py --quick   # s=128, b=2, h=256, a=4: about 25 s
    python benchmarks/transformer.py --profile # where a step's time goes (cProfile for ag, torch.profiler)

The model is ``ag.nn.Transformer(4, h, a, dropout=0.0)`` (``--dropout`` for another rate): pre-LN layers on activations (s, b, h),
y = x + proj(attn(ln1(x))), out = y + fc2(gelu(fc1(ln2(y)))), one fused QKV linear, causal
multi-head attention (num_query_groups=None, so the QKV columns are plain [Q | K | V], each head
by head). The PyTorch model (``torch_model``) has the same structure and holds ag's weights
(``torch.nn.Linear`` stores W transposed: ag's y = x W + b is torch's y = x Wᵀ + b).

Its attention is written out, ``softmax(mask(Q Kᵀ · scale)) V``, not torch SDPA: that is the
algorithm of ag's ``attention="naive"``, so both frameworks keep the (b, a, s, s) softmax output
for backward and the memory figures compare like with like, and checkpointing that core function
means on both sides what ag's "selective" means. torch's CPU SDPA runs a flash kernel that keeps
no scores, which is what ag's ``attention="flash"`` does (``benchmarks/attention.py``).

One step: forward and backward of loss = sum(out ∘ dY) with a fixed dY, into the input's grad and
every parameter's. Three modes:

- none: every activation that backward reads is kept;
- full: ``activations_checkpoint_granularity="full"``, method "uniform", num_layers 1 (each layer
  keeps its input and is rerun in backward); torch: ``checkpoint(layer, x, use_reentrant=False)``;
- selective: ag reruns each layer's attention core (QKᵀ, softmax, ·V) in backward; torch has no
  built-in equivalent, so its attention core goes through ``checkpoint`` in the same place.

Before timing, one step of each mode on both sides checks that out, dx and the parameter grads
agree (max |ag - torch| / max |torch|, float32). Time: medians and bests of steps that take turns
in one process (every mode of both frameworks, one after another), with the 72 products of a step
without recomputation alone (on NumPy's BLAS, as ag runs them: one np.matmul each on the classroom
path, in blocks on the lab's threads with ``AG_LAB=1``; and on torch's matmul) taking their turns
too, so that a missed time goal says whether the BLAS, ag's products or the passes outside them
limit it. Goals, ag / torch in every mode: time <= 1.5 on the classroom path (the default; issue
49), <= 1.10 with the lab on; peak memory <= 1.10. Memory: the peak of one step in
a fresh subprocess per framework and mode, as RSS growth (``_memory.py``), and for ag also as
tracemalloc sees it (``ag.trace``).
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
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ag  # noqa: E402
from _memory import rss_peak_of, run_workers  # noqa: E402
from _timing import take_turns  # noqa: E402
from _goals import goal, shown  # noqa: E402
from mlp import busy_limit, in_lab, machine_lines, print_table, products_alone  # noqa: E402
from _busy import busy_report  # noqa: E402

MB = 10**6
LAYERS = 4
MODES = ("none", "full", "selective")
AG_GRANULARITY = {"none": None, "full": "full", "selective": "selective"}
WARM_UP_POSITIONS = 64  # ag's warm-up in a memory worker: OpenBLAS's buffers fault in, at a fraction of a step
TORCH_PLAN = {"none": "no checkpoints", "full": "checkpoint(layer, x) per layer",
              "selective": "checkpoint(attention core)"}


# ---- the two models, with the same weights ----

def make_ag(args, mode: str) -> ag.nn.Transformer:
    """ag's model; biases and layer-norm parameters drawn at random so that copying them is checked too."""
    model = ag.nn.Transformer(LAYERS, args.hidden, args.heads, dropout=args.dropout, seed=0,
                              activations_checkpoint_granularity=AG_GRANULARITY[mode],
                              activations_checkpoint_method="uniform", activations_checkpoint_num_layers=1)
    rng = np.random.default_rng(1)
    for p in model.parameters():
        if p.value.ndim == 1:
            around = 1.0 if p.name.startswith("layernorm") and p.name.endswith("weight") else 0.0
            p.value[...] = around + 0.1 * rng.standard_normal(p.shape, dtype=np.float32)
    return model


def make_inputs(args, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """x and the fixed output grad dY, float32 (s, b, h), standard normal."""
    rng = np.random.default_rng(seed)
    shape = (args.seq, args.batch, args.hidden)
    return rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(shape, dtype=np.float32)


def torch_model(model: ag.nn.Transformer, mode: str, dropout: float):
    """The torch twin of ``model``, holding copies of its weights."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    class Layer(torch.nn.Module):
        """Pre-LN GPT layer on (s, b, h), attention written out as in ag's naive path."""

        def __init__(self, h: int, a: int, selective: bool) -> None:
            super().__init__()
            self.a, self.d, self.selective = a, h // a, selective
            self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
            self.qkv, self.proj = torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
            self.fc1, self.fc2 = torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)

        def core(self, q, k, v):
            """softmax(QKᵀ · scale, causal) V; only the softmax output is kept (scale and mask in place)."""
            s_q, s_k = q.shape[-2], k.shape[-2]
            future = torch.ones(s_q, s_k, dtype=torch.bool).triu_(1)
            scores = torch.matmul(q, k.transpose(-2, -1)).mul_(1 / math.sqrt(self.d)).masked_fill_(future, -math.inf)
            return torch.matmul(self.drop(scores.softmax(-1)), v)

        def drop(self, t):
            return F.dropout(t, dropout, self.training) if dropout else t  # ag's Dropout(0) is the identity too

        def forward(self, x):
            s, b, h = x.shape
            # (s, b, a, d) → (b, a, s, d), as ag's (s, b, g, G, d) → (b, g, G, s, d) with G = 1
            q, k, v = (t.reshape(s, b, self.a, self.d).permute(1, 2, 0, 3)
                       for t in self.qkv(self.ln1(x)).split(h, dim=-1))
            o = checkpoint(self.core, q, k, v, use_reentrant=False) if self.selective else self.core(q, k, v)
            y = x + self.drop(self.proj(o.permute(2, 0, 1, 3).reshape(s, b, h)))
            return y + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(y)), approximate="tanh")))

    class Stack(torch.nn.Module):
        def __init__(self, layers: list[Layer], full: bool) -> None:
            super().__init__()
            self.layers, self.full = torch.nn.ModuleList(layers), full

        def forward(self, x):
            for layer in self.layers:
                x = checkpoint(layer, x, use_reentrant=False) if self.full else layer(x)
            return x

    layers = []
    for source in model.layers:
        layer = Layer(source.hidden_size, source.num_heads, selective=mode == "selective")
        pairs = [(layer.ln1, source.ln1, False), (layer.qkv, source.attention.qkv, True),
                 (layer.proj, source.attention.proj, True), (layer.ln2, source.ln2, False),
                 (layer.fc1, source.mlp.fc1, True), (layer.fc2, source.mlp.fc2, True)]
        with torch.no_grad():
            for target, module, transposed in pairs:
                weight = module.weight.value.T if transposed else module.weight.value
                target.weight.copy_(torch.from_numpy(np.ascontiguousarray(weight)))
                target.bias.copy_(torch.from_numpy(module.bias.value))
        layers.append(layer)
    return Stack(layers, full=mode == "full")


def torch_parameters(stack) -> list:
    """torch's parameters in ag's order (ln1, qkv, proj, ln2, fc1, fc2; weight then bias)."""
    return [p for layer in stack.layers
            for module in (layer.ln1, layer.qkv, layer.proj, layer.ln2, layer.fc1, layer.fc2)
            for p in (module.weight, module.bias)]


class AgStep:
    """One training step of ag's model: zero the grads, forward, loss = sum(out ∘ dY), backward."""

    def __init__(self, args, mode: str, x: np.ndarray, dy: np.ndarray) -> None:
        self.model = make_ag(args, mode)
        self.x = ag.Tensor(x, requires_grad=True)
        self.dy = ag.Tensor(dy)

    def zero_grad(self) -> None:
        self.model.zero_grad()
        self.x.zero_grad()

    def __call__(self, keep_output: bool = False) -> np.ndarray | None:
        """The step; with ``keep_output`` it returns the output (held through backward, so not when measured)."""
        self.zero_grad()
        out = self.model(self.x)
        kept = out.value if keep_output else None
        loss = ag.sum(ag.mul(out, self.dy))
        ag.release_unneeded([loss], [self.x])  # the output: mul's backward reads only dY
        loss.backward()
        return kept

    def results(self) -> list[np.ndarray]:
        """out, dx and the parameter grads (torch's layout) of one step."""
        out = self(keep_output=True)
        return [out, self.x.grad] + [p.grad.T if p.ndim == 2 else p.grad for p in self.model.parameters()]


class TorchStep:
    """The same step in torch eager; the output has no name, so torch frees it once the product has run."""

    def __init__(self, args, mode: str, x: np.ndarray, dy: np.ndarray, source: ag.nn.Transformer) -> None:
        import torch
        self.model = torch_model(source, mode, args.dropout)
        self.x = torch.from_numpy(x.copy()).requires_grad_()
        self.dy = torch.from_numpy(dy)

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self.x.grad = None

    def __call__(self, keep_output: bool = False):
        self.zero_grad()
        if not keep_output:
            (self.model(self.x) * self.dy).sum().backward()
            return None
        out = self.model(self.x)
        (out * self.dy).sum().backward()
        return out.detach().numpy()

    def results(self) -> list[np.ndarray]:
        out = self(keep_output=True)
        return [out, self.x.grad.numpy()] + [p.grad.numpy() for p in torch_parameters(self.model)]


def contestants(args) -> dict[str, AgStep | TorchStep]:
    x, dy = make_inputs(args)
    steps: dict[str, AgStep | TorchStep] = {}
    for mode in MODES:
        steps[f"ag {mode}"] = AgStep(args, mode, x, dy)
        steps[f"torch {mode}"] = TorchStep(args, mode, x, dy, steps[f"ag {mode}"].model)
    return steps


def busy(args) -> None:
    """``--busy``: the step without recomputation on the classroom path, the lab's and torch's, idle and
    with one core busy."""
    x, dy = make_inputs(args)
    a = AgStep(args, "none", x, dy)
    steps = {"ag": a, "ag lab": in_lab(a), "torch": TorchStep(args, "none", x, dy, a.model)}
    busy_report("transformer step", steps, args.repeats, busy_limit(), print_table)


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def worst_differences(steps: dict) -> dict[str, tuple[float, float, float]]:
    """Per mode: (out, dx, worst parameter grad) relative differences of ag from torch, one step each."""
    worst = {}
    for mode in MODES:
        got, want = steps[f"ag {mode}"].results(), steps[f"torch {mode}"].results()
        diffs = [relative(g, w) for g, w in zip(got, want)]
        worst[mode] = (diffs[0], diffs[1], max(diffs[2:]))
    return worst


# ---- time ----

def products(args) -> tuple[int, dict[str, Callable[[], object]]]:
    """The products of a step without recomputation, alone, on NumPy's BLAS, as ag runs them and on
    torch's matmul (``products_alone``), with the same shapes and layouts: per layer x W for the QKV,
    output, fc1 and fc2 weights and the two stacks of attention products (Q Kᵀ and P V over b·a
    heads), each with the two products of its backward (dY Wᵀ and Xᵀ dY). Returns the count and the
    three runs."""
    s, b, h, a = args.seq, args.batch, args.hidden, args.heads
    t, d = s * b, h // a
    rng = np.random.default_rng(2)
    shapes = [((t, h), (h, 3 * h)), ((t, h), (h, h)), ((t, h), (h, 4 * h)), ((t, 4 * h), (4 * h, h)),
              ((b * a, s, d), (b * a, d, s)), ((b * a, s, s), (b * a, s, d))]
    triples = [(rng.standard_normal(x, dtype=np.float32), rng.standard_normal(w, dtype=np.float32),
                rng.standard_normal(x[:-1] + w[-1:], dtype=np.float32)) for x, w in shapes]
    return 3 * len(shapes) * LAYERS, products_alone(triples, times=LAYERS)


def time_limit(count: int, mode: str, med: dict[str, float], lab: bool | None = None) -> str:
    """What limits a mode's step time: the BLAS, where the products alone are slower on NumPy's than
    on torch's matmul (``products``); else ag's products (the lab's blocks), where the products as ag
    runs them are slower than both; else the passes outside them; figures in ms from ``med``. ``lab``:
    whether ag's step ran with the lab on (None: as it is now)."""
    lab = ag.lab.enabled() if lab is None else lab
    ms = {name: seconds * 1e3 for name, seconds in med.items()}
    numpy_ms, torch_ms = ms["numpy products"], ms["torch products"]
    ag_ms = ms["ag products"]
    rest = (f"outside them ag's step without recomputation takes {ms['ag none'] - ag_ms:.0f} ms, "
            f"torch's {ms['torch none'] - torch_ms:.0f}")
    reruns = "" if mode == "none" else f"; {mode} reruns some of them"
    if numpy_ms > 1.02 * torch_ms:
        return (f"NumPy's BLAS first: the {count} products of a step without recomputation take {numpy_ms:.0f} ms "
                f"alone on NumPy's BLAS against {torch_ms:.0f} on torch's matmul ({numpy_ms / torch_ms:.2f} x), "
                f"the same shapes, and {ag_ms:.0f} as ag runs them; {rest}" + reruns)
    if ag_ms > 1.02 * max(numpy_ms, torch_ms) and lab:
        return (f"ag's blocks first: the {count} products of a step without recomputation take {ag_ms:.0f} ms as ag "
                f"runs them (large ones in blocks on its op threads, one BLAS thread each) against {numpy_ms:.0f} "
                f"in one call each on NumPy's BLAS and {torch_ms:.0f} on torch's matmul; {rest}" + reruns)
    if ag_ms > 1.02 * max(numpy_ms, torch_ms):
        return (f"ag's ops around the products first: the {count} products of a step without recomputation take "
                f"{ag_ms:.0f} ms as ag's matmul runs them (one np.matmul each, on Tensors) against {numpy_ms:.0f} "
                f"in one call each on NumPy's BLAS and {torch_ms:.0f} on torch's matmul; {rest}" + reruns)
    limits = LIMITS["time"] if lab else CLASSROOM_TIME_LIMIT
    return (f"the passes outside the products ({rest}; the {count} products alone take {numpy_ms:.0f} ms on "
            f"NumPy's BLAS, {ag_ms:.0f} as ag runs them, {torch_ms:.0f} on torch's matmul): {limits}")


def time_table(times: dict[str, list[float]]) -> list[list[str]]:
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}
    rows = []
    for mode in MODES:
        a, t = f"ag {mode}", f"torch {mode}"
        rows.append([mode, TORCH_PLAN[mode], f"{med[a] * 1e3:.0f}", f"{med[t] * 1e3:.0f}",
                     shown(med[a] / med[t], time_goal()),
                     f"{best[a] * 1e3:.0f}", f"{best[t] * 1e3:.0f}", f"{best[a] / best[t]:.2f}",
                     f"{med[a] / med['ag none']:.2f}", f"{med[t] / med['torch none']:.2f}"])
    return rows


# ---- peak memory, in a fresh subprocess per framework and mode ----

def memory_worker(framework: str, mode: str, args) -> dict:
    """In a fresh process: one warm-up step, then the peak of one step (RSS; and tracemalloc for ag)."""
    x, dy = make_inputs(args)
    a = AgStep(args, mode, x, dy)
    if framework == "ag":
        AgStep(args, mode, x[:WARM_UP_POSITIONS].copy(), dy[:WARM_UP_POSITIONS].copy())()  # NumPy keeps no buffers
        step = a
    else:
        step = TorchStep(args, mode, x, dy, a.model)
        step()  # full size: MKL and oneDNN may keep buffers for the shapes they have seen
        del a
    del x, dy
    step.zero_grad()  # the measured step makes the grads: they count
    result = {}
    result["rss_peak"], result["rss_after"] = rss_peak_of(step)
    if framework == "ag":
        step.zero_grad()
        gc.collect()
        ag.trace.start_trace()
        try:
            step()
            result["tracemalloc_peak"] = ag.trace.snapshot_trace().peak_bytes
        finally:
            ag.trace.end_trace()
    return result


def memory_command(framework: str, mode: str, args) -> tuple[list[str], str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-worker", framework, mode,
           "--seq", str(args.seq), "--batch", str(args.batch), "--hidden", str(args.hidden),
           "--heads", str(args.heads), "--dropout", str(args.dropout)]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    return cmd, f"{framework} {mode}"


def memory_table(args) -> list[list[str]]:
    mem = run_workers({(f, m): memory_command(f, m, args) for m in MODES for f in ("ag", "torch")})
    rows = []
    for mode in MODES:
        a, t = mem[("ag", mode)], mem[("torch", mode)]
        saved_a = 1 - a["rss_peak"] / mem[("ag", "none")]["rss_peak"]
        saved_t = 1 - t["rss_peak"] / mem[("torch", "none")]["rss_peak"]
        rows.append([mode, f"{a['tracemalloc_peak'] / MB:.1f}", f"{a['rss_peak'] / MB:.1f}",
                     f"{t['rss_peak'] / MB:.1f}", shown(a['rss_peak'] / t['rss_peak'], GOAL),
                     "" if mode == "none" else f"{saved_a:.0%}", "" if mode == "none" else f"{saved_t:.0%}",
                     f"{a['rss_after'] / MB:.0f} / {t['rss_after'] / MB:.0f}"])
    return rows


def sizes_line(args) -> str:
    """What one layer's tensors weigh in float32, and the parameters."""
    s, b, h, a = args.seq, args.batch, args.hidden, args.heads
    params = LAYERS * (12 * h * h + 13 * h) * 4
    return (f"float32: one (s, b, h) tensor {s * b * h * 4 / MB:.1f} MB, one (b, a, s, s) score tensor "
            f"{b * a * s * s * 4 / MB:.1f} MB, the parameters {params / MB:.1f} MB (and as much for their grads)")


MEMORY_METHOD = """
Method: each framework and mode in a fresh subprocess; x, dY and the weights exist before the step,
the grads of x and of the weights are made during it (they count, and are 'kept after'). One
warm-up step (ag's on 64 positions: NumPy keeps no buffers; torch's at full size), then the RSS
method of mlp.py (VmHWM during one step, reset through /proc/self/clear_refs, minus VmRSS before
it, with MALLOC_MMAP_THRESHOLD_=131072), then for ag a second step under tracemalloc (ag.trace).
'saved' is 1 - peak / the same framework's none peak."""


# ---- where ag's time goes ----

def profile(args, steps: int = 2) -> None:
    """cProfile of ag's step without recomputation (a closure's time includes its NumPy work), torch.profiler
    of torch's, then the two NumPy calls that the profile points at, each timed alone."""
    import cProfile
    import pstats
    import timeit

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    x, dy = make_inputs(args)
    a = AgStep(args, "none", x, dy)
    t = TorchStep(args, "none", x, dy, a.model)
    a(), t()
    print(f"\nag, {steps} steps without recomputation, by own time (ag/ops/*.py:N(_backward) is that op's backward):")
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [a() for _ in range(steps)])
    pstats.Stats(profiler).sort_stats("tottime").print_stats(10)
    print(f"torch, {steps} steps without recomputation, by self CPU time:")
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            t()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))

    def best_ms(stmt: Callable[[], object]) -> float:
        return min(timeit.repeat(stmt, number=1, repeat=5)) * 1e3
    s, b, h = args.seq, args.batch, args.hidden
    rng = np.random.default_rng(0)
    act, w = rng.standard_normal((s, b, h), dtype=np.float32), rng.standard_normal((h, 3 * h), dtype=np.float32)
    wide = rng.standard_normal((s, b, 4 * h), dtype=np.float32)
    rows = [["np.matmul(x, W_qkv), x of shape (s, b, h)", f"{best_ms(lambda: np.matmul(act, w)):.1f}",
             "np.matmul(x.reshape(s·b, h), W_qkv)", f"{best_ms(lambda: np.matmul(act.reshape(-1, h), w)):.1f}"],
            ["a ** 3, a = the GeLU input (s, b, 4h)", f"{best_ms(lambda: wide ** 3):.1f}",
             "a * a * a", f"{best_ms(lambda: wide * wide * wide):.1f}"],
            ["np.tanh(a)", f"{best_ms(lambda: np.tanh(wide)):.1f}", "a + a", f"{best_ms(lambda: wide + wide):.1f}"]]
    print_table("Two NumPy calls from ag's step, float32, best ms of 5", ["as ag calls it", "ms", "alternative", "ms"],
                rows)


# ---- main ----

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="s=128, b=2, h=256, a=4, 3 repeats")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="dropout of both models (> 0: the agreement check is skipped, masks differ)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--threads", type=int, default=None,
                        help="both frameworks on this many threads (NumPy's BLAS and torch's); default: "
                             "as they start, the machine's cores. 1 shows what the second core is worth to each")
    parser.add_argument("--profile", action="store_true", help="only profile ag's and torch's step (no recomputation)")
    parser.add_argument("--busy", action="store_true", help="only the step idle and with one core kept busy")
    parser.add_argument("--memory-worker", nargs=2, metavar=("FRAMEWORK", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.seq, args.batch, args.hidden, args.heads, args.repeats = 128, 2, 256, 4, 3
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    return args


GOAL = 1.10  # issue 14: ag / torch, in peak memory in every mode, and in time with the lab on
CLASSROOM_TIME_GOAL = 1.5  # issue 49: ag / torch in time, every mode, on the classroom path (the default)
# what a missed classroom time goal is limited by, outside the products
CLASSROOM_TIME_LIMIT = ("on the classroom path every pass but the products runs on one core, a NumPy call "
                        "each over the whole array (layer norm, GeLU, softmax, the residual adds, the bias grads, "
                        "the head copies), where torch runs them on all its threads and fuses some; only the "
                        "products use the BLAS's threads")
LIMITS = {
    "time": ("ag still runs some passes on one core (the residual adds, the bias grads, the head copies, "
             "dropout's x * mask): the products, softmax, GeLU, layer norm and dropout's mask and backward "
             "are shared among the cores (ag.set_workers), the rest not; torch runs every pass on both "
             "(BENCHMARKS.md)"),
    "memory none": "the temporaries of NumPy's elementwise passes, which torch fuses or runs in place",
    "memory selective": "the temporaries of NumPy's elementwise passes, which torch fuses or runs in place",
    "memory full": "the rerun layer's recomputed activations alive beside its backward's grads and temporaries",
}


def time_goal() -> float:
    """ag / torch in time: the lab's goal with the lab on (``AG_LAB=1``), else the classroom's."""
    return GOAL if ag.lab.enabled() else CLASSROOM_TIME_GOAL


def hold_threads(threads: int | None) -> None:
    """Both frameworks on ``threads`` threads for the rest of the process (None: as they are): torch's,
    NumPy's BLAS and ag's op threads (``ag.set_workers``, whose blocks hold BLAS to one thread each)."""
    if threads is None:
        return
    import torch
    from threadpoolctl import threadpool_limits
    torch.set_num_threads(threads)
    threadpool_limits(limits=threads, user_api="blas")  # stays set: its restore is never called
    ag.set_workers(threads)


def main() -> None:
    args = parse_args()
    hold_threads(args.threads)
    if args.memory_worker:
        print(json.dumps(memory_worker(*args.memory_worker, args)))
        return
    started = time.perf_counter()
    print(f"Transformer step: {LAYERS} layers, s={args.seq}, b={args.batch}, h={args.hidden}, a={args.heads}, "
          f"float32, dropout {args.dropout}; loss = sum(out ∘ dY), forward + backward")
    print(sizes_line(args))
    for line in machine_lines():
        print(line)
    print(f"load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          "(other processes on the machine slow both frameworks and add noise)")
    if args.profile:
        profile(args)
        return
    if args.busy:
        busy(args)
        return

    took = {}
    start = time.perf_counter()
    steps = contestants(args)
    if args.dropout == 0:
        worst = worst_differences(steps)  # also the warm-up step of each
        print("max relative difference ag - torch (out, dx, worst parameter grad): " +
              "; ".join(f"{mode} {o:.1e}, {dx:.1e}, {p:.1e}" for mode, (o, dx, p) in worst.items()))
    else:
        for step in steps.values():
            step()
        print(f"dropout {args.dropout}: the masks of the two frameworks differ, no agreement check")
    took["check"], start = time.perf_counter() - start, time.perf_counter()
    count, alone = products(args)
    for run in alone.values():
        run()  # warm-up
    times = take_turns({**steps, **alone}, args.repeats)
    took["time"], start = time.perf_counter() - start, time.perf_counter()
    del steps
    gc.collect()
    time_rows, memory_rows = time_table(times), []
    print_table(f"Time per step (median and best of {args.repeats} after a warm-up, every contestant in turn)",
                ["mode", "torch plan", "ag ms", "torch ms", "ag/torch", "best ag ms", "best torch ms",
                 "best ag/torch", "ag / ag none", "torch / torch none"], time_rows)
    if not args.no_memory:
        memory_rows = memory_table(args)
        print_table("Peak memory of one step (RSS growth in a fresh subprocess; ag also by tracemalloc)",
                    ["mode", "ag tracemalloc MB", "ag RSS MB", "torch RSS MB", "ag/torch (RSS)",
                     "ag saved", "torch saved", "kept after step ag / torch MB"], memory_rows)
        print(MEMORY_METHOD)
        took["memory"] = time.perf_counter() - start
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"\nThe {count} products of a step without recomputation, alone (median ms, the same shapes and layouts): "
          f"NumPy's BLAS {med['numpy products'] * 1e3:.0f}, as ag runs them {med['ag products'] * 1e3:.0f}, "
          f"torch's matmul {med['torch products'] * 1e3:.0f}; NumPy / torch "
          f"{med['numpy products'] / med['torch products']:.2f}, ag / torch "
          f"{med['ag products'] / med['torch products']:.2f}\n")
    for row in time_rows:
        goal(f"transformer step time, {row[0]}, ag / torch (median)", float(row[4]), time_goal(),
             limited_by=time_limit(count, row[0], med))
    for row in memory_rows:
        goal(f"transformer step peak, {row[0]}, ag / torch (RSS)", float(row[4]), GOAL,
             limited_by=LIMITS[f"memory {row[0]}"])
    print(f"\nload average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; the run took "
          f"{time.perf_counter() - started:.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()) + ")")


if __name__ == "__main__":
    main()
