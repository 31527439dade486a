"""The lecture's demos, as functions that return what they measured and print it as tables.

``ag demo memory`` runs ``memory()``; notebooks and tests call the pieces directly.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from . import memory_model, nn, ops, optim, plot, remat, trace, train, wall
from .attention import flash_attention, naive_attention
from .plot.html import memory_html
from .remat import capture, examples
from .remat.graphs.sweep import budgets_between, sweep
from .trace import count_ops
from .modes import eager_grads
from .tables import table
from .tensor import Tensor

N = 1000


@dataclass
class ChainRun:
    """Snapshots of a chain of ``x = matmul(x, w)`` layers: after each layer, then after each backward step."""

    forward: list[trace.Snapshot]
    backward: list[trace.Snapshot]


def array_cost(n: int = N) -> tuple[int, int]:
    """(bytes of data, sys.getsizeof) of a float64 array of shape (n, n)."""
    a = np.zeros((n, n))
    return a.nbytes, sys.getsizeof(a)


def numpy_trace(n: int = N, drop_b: bool = False) -> trace.Snapshot:
    """The slide: ``a = 1.0*np.zeros((n,n)); b = a*a; c = np.sum(b, axis=1)`` traced."""
    trace.start_trace()
    try:
        a = 1.0 * np.zeros((n, n))
        b = a * a
        c = np.sum(b, axis=1)  # noqa: F841 (alive while we measure)
        if drop_b:
            b = None
        return trace.snapshot_trace()
    finally:
        trace.end_trace()


def matmul_chain(batch: int, n_layers: int, *, eager: bool, width: int = N,
                 seed: int = 0) -> ChainRun:
    """``x = ag.matmul(x, w)`` over ``n_layers`` weights of shape (width, width), traced.

    ``eager=True`` is the lecture's "before" (every Tensor allocates its grad in the
    constructor); ``eager=False`` is requires_grad with grads allocated in backward.
    """
    with eager_grads(eager):
        x, weights = _chain_tensors(batch, n_layers, width, seed)
        trace.start_trace()
        try:
            forward = []
            for w in weights:
                x = ops.matmul(x, w)
                forward.append(trace.snapshot_trace("matmul", "forward"))
            loss = ops.sum(x)
            del x
            backward = loss.backward(trace=True)
        finally:
            trace.end_trace()
    return ChainRun(forward, backward)


def _chain_tensors(batch: int, n_layers: int, width: int, seed: int) -> tuple[Tensor, list[Tensor]]:
    """The chain's input x (batch, width) and its weights w0, w1, … (width, width), which require grad."""
    rng = np.random.default_rng(seed)
    weights = [Tensor(rng.standard_normal((width, width)) / np.sqrt(width), requires_grad=True, name=f"w{i}")
               for i in range(n_layers)]
    return Tensor(rng.standard_normal((batch, width)), name="x"), weights


def _mb_row(snapshots: list[trace.Snapshot]) -> str:
    return ", ".join(str(s.allocated_mb) for s in snapshots)


def memory(out_dir: str | None = None, html: str | None = None) -> None:
    """Print every number of the lecture's memory part, measured now. Given ``out_dir``, also draw
    the chain's memory before and after lazy grads there (``lazy_grads_stack.png``); given ``html``,
    write the same timelines as one interactive HTML file."""
    nbytes, getsizeof = array_cost()
    print("1. What a NumPy array costs")
    print(f"   float64 array of shape ({N}, {N}): nbytes = {nbytes:,} B, "
          f"sys.getsizeof = {getsizeof:,} B (header {getsizeof - nbytes} B)")
    print()
    print("2. Tracing NumPy with tracemalloc: a = 1.0*np.zeros((n,n)); b = a*a; c = np.sum(b, axis=1)")
    print("   ", end="")
    trace.print_trace_stats(numpy_trace())
    print("   with b = None: ", end="")
    trace.print_trace_stats(numpy_trace(drop_b=True))
    print()
    before = matmul_chain(4000, 3, eager=True)
    after = matmul_chain(4096, 5, eager=False)
    print("3. x = ag.matmul(x, w), weights (1000, 1000): memory allocated (MB) after each layer")
    print(f"   before (grad = zeros_like(value) in every constructor), batch 4000: {_mb_row(before.forward)}")
    print(f"   after (requires_grad, grads allocated in backward),     batch 4096: {_mb_row(after.forward)}")
    print()
    print("4. Backward of sum(x): memory allocated (MB) after each backward step (sum, then matmuls)")
    print(f"   before, batch 4000: {_mb_row(before.backward)}")
    print(f"   after,  batch 4096: {_mb_row(after.backward)}")
    same = matmul_chain(4096, 5, eager=True)
    print(f"   peak of forward + backward (tracemalloc) at batch 4096, 5 layers: before "
          f"{same.backward[-1].peak_bytes // trace.MB} MB, after {after.backward[-1].peak_bytes // trace.MB} MB")
    print("   after: each intermediate's grad is freed once its own backward step has run,")
    print("   and its value once nothing left in the graph reads it.")
    if out_dir is None and not html:
        return
    timelines = chain_timelines(4096, 5)
    if out_dir is not None:
        _save_plot(out_dir, "lazy_grads_stack.png", lambda plot, path: plot.memory_stack(
            timelines, path=path, title="x = ag.matmul(x, w), 5 layers, batch 4096: what the memory holds"))
    if html:
        _save_html(html, timelines, "x = ag.matmul(x, w), 5 layers, batch 4096: "
                   "grads allocated in every constructor (before) or in backward (after)")


def chain_timelines(batch: int, n_layers: int, width: int = N, seed: int = 0) -> dict[str, list[trace.Snapshot]]:
    """``matmul_chain``'s forward and backward recorded by ``trace.tracing()``, before (eager grads)
    and after (grads allocated in backward): the timelines ``ag.plot.memory_html`` draws."""
    timelines = {}
    for label, eager in (("before (eager grads)", True), ("after (lazy grads)", False)):
        with eager_grads(eager):
            x, weights = _chain_tensors(batch, n_layers, width, seed)
            with trace.tracing() as timeline:
                for w in weights:
                    x = ops.matmul(x, w)
                loss = ops.sum(x)
                del x
                loss.backward()
        timelines[label] = timeline
    return timelines


@dataclass
class RematRun:
    """One strategy on the lecture's chain: its plan, peak, products by phase, time and timeline."""

    strategy: str
    checkpoints: list[int]
    mode: str
    peak_bytes: int
    predicted_peak_bytes: int
    counts: object
    seconds: float
    timeline: list[trace.Snapshot]


def remat_strategies(n_layers: int = 10, batch: int = 512, width: int = N, seed: int = 0,
                     dtype=np.float32) -> list[RematRun]:
    """Every checkpoint strategy on a chain of ``x = ag.matmul(x, w)`` layers, measured."""
    import time

    rng = np.random.default_rng(seed)
    weights = [Tensor((rng.standard_normal((width, width)) / np.sqrt(width)).astype(dtype), requires_grad=True)
               for _ in range(n_layers)]
    layers = [lambda h, w=w: ops.matmul(h, w) for w in weights]
    x = Tensor(rng.standard_normal((batch, width)).astype(dtype))
    profile = remat.profile(layers, x)
    budget = remat.predict(profile, remat.plan(n_layers, "sqrt")).peak_bytes  # greedy, optimal: same budget
    plans = {
        "keep all": remat.plan(n_layers, "keep all"),
        "uniform (2)": remat.plan(n_layers, "uniform", num_layers=2),
        "block (5)": remat.plan(n_layers, "block", num_layers=5),
        "sqrt": remat.plan(n_layers, "sqrt"),
        "greedy": remat.plan(n_layers, "greedy", chain=profile, budget_bytes=budget),
        "optimal": remat.plan(n_layers, "optimal", chain=profile, budget_bytes=budget),
        "keep none": remat.plan(n_layers, "keep none"),
    }
    runs = []
    for name, kept in plans.items():
        mode = remat.mode_for(name.split(" (")[0])
        ops.sum(remat.sequential(layers, x, kept, mode=mode)).backward()  # warm-up; weights' grads exist
        seconds = float("inf")
        for _ in range(3):  # best of three: a shared machine adds noise, never speed
            start = time.perf_counter()
            ops.sum(remat.sequential(layers, x, kept, mode=mode)).backward()
            seconds = min(seconds, time.perf_counter() - start)
        with trace.tracing() as timeline, count_ops() as counts:
            ops.sum(remat.sequential(layers, x, kept, mode=mode)).backward()
        runs.append(RematRun(name, kept, mode, max(s.peak_bytes for s in timeline),
                             remat.predict(profile, kept, mode=mode).peak_bytes, counts, seconds, timeline))
    return runs


def remat_demo(out_dir: str = "ag-plots", html: str | None = None) -> None:
    """Print the strategy table for the lecture's 10-layer chain and write its plots; given ``html``,
    also every strategy's timeline as one interactive HTML file there."""
    runs = remat_strategies()
    print("Rematerialization on 10 layers of x = ag.matmul(x, w): batch 512, width 1000, float32")
    print("(peak: tracemalloc over forward + backward; pred: ag.remat.predict, which counts activations")
    print(" and their grads: the measured peak also holds one weight's grad in flight, 4 MB)")
    print()
    table(("strategy", "kept outputs", "mode", "peak MB", "pred MB", "fwd", "recomp", "bwd", "best ms"),
          [_strategy_row(r) for r in runs], left=3)
    print()
    print("matmuls: the lecture counts 30 without and 75 with full recomputation because it also")
    print("computes the input's grad; ag skips it (the input needs none), so 29 and 74.")
    timelines = {r.strategy: r.timeline for r in runs}
    _save_plot(out_dir, "remat_timeline.png", lambda plot, path: plot.memory_timeline(
        timelines, path=path, title="Memory over one training step, by strategy"))
    _save_plot(out_dir, "remat_stack.png", lambda plot, path: plot.memory_stack(
        timelines, path=path, title="What the memory holds, by strategy (line: tracemalloc)"))
    _save_plot(out_dir, "remat_tradeoff.png", lambda plot, path: plot.tradeoff(
        {r.strategy: (r.peak_bytes, r.counts.flops["recompute"]) for r in runs}, path=path,
        title="Peak memory against recomputation",
        budget_bytes=next(r.predicted_peak_bytes for r in runs if r.strategy == "sqrt"),
        budget_label="greedy's and optimal's budget (on the predicted peak)"))
    if html:
        _save_html(html, timelines, "Rematerialization on 10 layers of x = ag.matmul(x, w): every strategy")


def _strategy_row(r: RematRun) -> tuple:
    """One line of ``remat_demo``'s table: the plan, the peaks in MB, the matmuls by phase, the time."""
    m = r.counts.matmuls
    return (r.strategy, r.checkpoints, r.mode, f"{r.peak_bytes / trace.MB:.1f}",
            f"{r.predicted_peak_bytes / trace.MB:.1f}", m["forward"], m["recompute"], m["backward"],
            f"{r.seconds * 1e3:.1f}")


def remat_graph_demo(out_dir: str = "ag-plots", *, budgets: int = 5, time_limit: float = 10) -> dict:
    """Checkmate's Figure 4 on ag: every planner on three captured graphs, measured by running it."""
    graphs = {"residual MLP": examples.residual_mlp(), "U-Net": examples.unet(),
              "2-layer transformer": examples.transformer(layers=2)}
    sweeps, flops = {}, {}
    for name, (fn, inputs) in graphs.items():
        graph = capture(fn, *inputs)
        print(f"{name}: {graph.summary()}")
        sweeps[name] = sweep(graph, budgets_between(graph, budgets), time_limit=time_limit)
        flops[name] = graph.forward_flops
        rows = [(p.planner, "-" if p.budget_bytes is None else f"{p.budget_bytes / trace.MB:.2f}",
                 f"{p.predicted_peak_bytes / trace.MB:.2f}", f"{p.peak_bytes / trace.MB:.2f}",
                 f"{p.recompute_flops / 1e6:,.1f}", p.status, "-" if p.gap is None else f"{p.gap:.0%}",
                 f"{p.solve_seconds:.1f}") for p in sweeps[name]]
        table(("planner", "budget MB", "pred MB", "peak MB", "recompute MFLOP", "status", "gap", "solver s"),
              rows)
        print()
    print("(peak: tracemalloc over forward + backward, leaves included; pred: ag.remat's memory model;")
    print(" gap: how far above HiGHS' lower bound a time-limited MILP stopped)")
    _save_plot(out_dir, "remat_frontier.png",
               lambda plot, path: plot.remat_frontier(sweeps, flops, path=path,
                                                      title="Checkmate's Figure 4 on ag: recompute against memory"))
    return sweeps


def _save_html(path: str, timelines: dict[str, list[trace.Snapshot]], title: str) -> None:
    """Write the timelines to ``path`` as one interactive HTML file (works offline) and print where."""
    import os

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    print(f"interactive timeline written: {memory_html(timelines, path, title=title)}")


def _save_plot(out_dir: str, name: str, draw) -> None:
    """Draw one plot into ``out_dir/name``, or say why not (no matplotlib)."""
    import os
    try:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, name)
        draw(plot, path)
        print(f"plot written: {path}")
    except ImportError as error:
        print(f"plot skipped: {error}")


@dataclass
class AttentionPeak:
    """Peak bytes of one forward + backward at sequence length n, for both attention paths."""

    n: int
    naive_bytes: int | None
    flash_bytes: int


def attention_scaling(sizes=(512, 1024, 2048, 4096, 8192, 16384), naive_up_to: int = 4096,
                      heads: int = 1, d: int = 64, dtype=np.float32, seed: int = 0,
                      device="cpu") -> list[AttentionPeak]:
    """Peak of forward + backward for naive and flash attention as N grows: tracemalloc's on
    the CPU; with ``device="gpu"``, CuPy's memory pool's (the CUDA kernels run flash)."""
    rng = np.random.default_rng(seed)
    xp = np if device == "cpu" else trace.device_module(device)
    backend = "numpy" if device == "cpu" else "cupy"
    flash_options = {"backend": backend}
    # one untraced call of each first: flash's first call imports and sets up its threads'
    # control (threadpoolctl, 0.25 MB of Python objects), which is not attention's memory
    for n in sizes[:1]:
        warm = [Tensor(xp.zeros((1, heads, n, d), dtype), requires_grad=True) for _ in range(3)]
        for attention, options in ((naive_attention, {}), (flash_attention, {"backend": backend})):
            attention(*warm, **options).backward(xp.ones((1, heads, n, d), dtype))
        del warm
    rows = []
    for n in sizes:
        q, k, v = (xp.asarray(rng.standard_normal((1, heads, n, d)).astype(dtype)) for _ in range(3))
        peaks = []
        for attention in (naive_attention, flash_attention):
            if attention is naive_attention and n > naive_up_to:
                peaks.append(None)
                continue
            tensors = [Tensor(x, requires_grad=True) for x in (q, k, v)]
            options = flash_options if attention is flash_attention else {}
            trace.start_trace(device)
            out = attention(*tensors, **options)
            out.backward(np.ones_like(out.value))
            peaks.append(trace.snapshot_trace().peak_bytes)
            trace.end_trace()
            del out, tensors
        rows.append(AttentionPeak(n, *peaks))
    return rows


def attention_demo(out_dir: str = "ag-plots", device="cpu") -> None:
    """Print how the peak memory of attention grows with N, and plot it on log-log axes."""
    rows = attention_scaling(device=device)
    where = "tracemalloc" if device == "cpu" else "GPU: CuPy's memory pool (tracemalloc cannot see it)"
    print(f"Peak memory of one attention forward + backward ({where}), 1 head, d = 64, float32")
    print()
    header = f"{'N':>6} {'naive MB':>10} {'flash MB':>10} {'naive/flash':>12} {'N x N array MB':>15}"
    print(header)
    print("-" * len(header))
    for r in rows:
        naive = f"{r.naive_bytes / trace.MB:10.1f}" if r.naive_bytes else f"{'(skipped)':>10}"
        ratio = f"{r.naive_bytes / r.flash_bytes:12.1f}" if r.naive_bytes else f"{'':>12}"
        print(f"{r.n:>6} {naive} {r.flash_bytes / trace.MB:10.1f} {ratio} {r.n * r.n * 4 / trace.MB:15.1f}")
    print()
    print("naive holds S and P (N x N each) and their grads; flash holds O(N·d): Q, K, V, O, the")
    print("logsumexp and one tile. Doubling N multiplies naive's peak by ~4 and flash's by ~2.")
    _save_plot(out_dir, "attention_scaling.png", lambda plot, path: plot.scaling(
        {"naive": [(r.n, r.naive_bytes) for r in rows if r.naive_bytes], "flash": [(r.n, r.flash_bytes) for r in rows]},
        path=path, title="Attention: peak memory of forward + backward"))


@dataclass
class ActivationRow:
    """Activation bytes per layer after the forward, measured in float16 and predicted by
    ``ag.memory_model``; a stack of ``num_layers`` layers reports its total / num_layers."""

    s: int
    b: int
    h: int
    a: int
    num_query_groups: int | None
    setting: str
    formula: str
    measured_bytes: int
    predicted_bytes: int
    num_layers: int = 1

    @property
    def measured_per_layer(self) -> float:
        return self.measured_bytes / self.num_layers

    @property
    def predicted_per_layer(self) -> float:
        return self.predicted_bytes / self.num_layers

    @property
    def ratio(self) -> float:
        return self.measured_bytes / self.predicted_bytes


TRANSFORMER_SHAPES = ((512, 1, 64, 4), (256, 2, 128, 8), (32, 4, 256, 4))  # (s, b, h, a): s ≫ h, s ≈ h, s ≪ h
GQA_SHAPE = (256, 2, 128, 8, 2)  # (s, b, h, a, num_query_groups): 4 query heads share each K, V head
LAYER_SETTINGS = ("none", "selective", "full", "flash")
STACK_SETTINGS = (("uniform", 1), ("uniform", 2), ("block", 2))  # (activations_checkpoint_method, num_layers)


def _layer_input(s: int, b: int, h: int, seed: int) -> Tensor:
    x = np.random.default_rng(seed).standard_normal((s, b, h)).astype(np.float16)
    return Tensor(x, requires_grad=True)


def _formula(setting: str, grouped: bool) -> str:
    """The per-layer expression of ``setting`` (K and V at g/a of Q's size when ``grouped``)."""
    base = "30+4g/a" if grouped else "34"
    return {"none": f"sbh({base}+5as/h)", "selective": f"sbh({base})" if grouped else "34sbh",
            "full": "2sbh", "flash": f"sbh({base})+4asb" if grouped else "34sbh+4asb"}[setting]


def layer_activations(s: int, b: int, h: int, a: int, setting: str, *, num_query_groups: int | None = None,
                      seed: int = 0) -> ActivationRow:
    """One float16 TransformerLayer: ``setting`` is "none", "selective", "full" (NeMo's
    activations_checkpoint_granularity) or "flash" (attention="flash", which keeps selective's
    bytes plus its logsumexp, one float32 per head and token: 4asb)."""
    if setting not in LAYER_SETTINGS:
        raise ValueError(f"layer_activations: setting must be one of {LAYER_SETTINGS}, got {setting!r}")
    granularity = setting if setting in ("selective", "full") else None
    layer = nn.TransformerLayer(h, a, num_query_groups=num_query_groups, dtype=np.float16, seed=seed,
                                attention="flash" if setting == "flash" else "naive",
                                activations_checkpoint_granularity=granularity)
    measured = trace.measure_activation_bytes(layer, _layer_input(s, b, h, seed))
    recompute = "selective" if setting == "flash" else granularity
    predicted = memory_model.activation_bytes_per_layer(s, b, h, a, recompute=recompute,
                                                        num_query_groups=num_query_groups)
    if setting == "flash":
        predicted += 4 * a * s * b
    grouped = num_query_groups not in (None, a)
    return ActivationRow(s, b, h, a, num_query_groups, setting, _formula(setting, grouped), measured, predicted)


def stack_activations(num_layers: int, s: int, b: int, h: int, a: int, method: str, n: int, *,
                      seed: int = 0) -> ActivationRow:
    """A float16 Transformer of ``num_layers`` with full recomputation after its forward:
    uniform keeps each chunk's input, ⌈L/n⌉·2sbh; block keeps n inputs and L − n whole
    layers, n·2sbh + (L − n)·F with F = sbh(34 + 5as/h)."""
    model = nn.Transformer(num_layers, h, a, activations_checkpoint_granularity="full",
                           activations_checkpoint_method=method, activations_checkpoint_num_layers=n,
                           dtype=np.float16, seed=seed)
    measured = trace.measure_activation_bytes(model, _layer_input(s, b, h, seed))
    full = memory_model.activation_bytes_per_layer(s, b, h, a)
    kept_input = memory_model.activation_bytes_per_layer(s, b, h, a, recompute="full")
    if method == "uniform":
        predicted, formula = -(-num_layers // n) * kept_input, "ceil(L/n)*2sbh/L"
    else:
        predicted, formula = n * kept_input + (num_layers - n) * full, "(n*2sbh+(L-n)*F)/L"
    return ActivationRow(s, b, h, a, None, f"full {method} n={n}, L={num_layers}", formula, measured,
                         predicted, num_layers)


def transformer_memory(shapes=TRANSFORMER_SHAPES, *, gqa=GQA_SHAPE, num_layers: int = 4,
                       seed: int = 0) -> list[ActivationRow]:
    """Every setting of ``ag demo transformer``, measured: each shape under every layer
    setting, the GQA shape without and with selective recomputation, and a stack of
    ``num_layers`` layers of the first shape under each of NeMo's full-recomputation methods."""
    rows = [layer_activations(*shape, setting, seed=seed) for shape in shapes for setting in LAYER_SETTINGS]
    if gqa is not None:
        *shape, groups = gqa
        rows += [layer_activations(*shape, setting, num_query_groups=groups, seed=seed)
                 for setting in ("none", "selective")]
    rows += [stack_activations(num_layers, *shapes[0], method, n, seed=seed) for method, n in STACK_SETTINGS]
    return rows


def activation_table(rows: list[ActivationRow]) -> None:
    """Print measured against predicted bytes per layer, one row per setting."""
    table(("s", "b", "h", "a", "g", "recomputation", "measured B", "predicted B", "ratio", "predicted by"),
          [(r.s, r.b, r.h, r.a, r.num_query_groups or r.a, r.setting, f"{r.measured_per_layer:,.0f}",
            f"{r.predicted_per_layer:,.0f}", f"{r.ratio:.4f}", r.formula) for r in rows])


def activation_series(rows: list[ActivationRow]) -> dict[str, list[tuple[float, float]]]:
    """(predicted, measured) bytes per layer by setting, as ``ag.plot.measured_vs_predicted`` takes them."""
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault(_series_label(r), []).append((r.predicted_per_layer, r.measured_per_layer))
    return series


def _series_label(row: ActivationRow) -> str:
    """The plot's legend entry: the setting, without the stack size, with GQA marked."""
    if row.num_layers > 1:
        return row.setting.split(",")[0]
    grouped = row.num_query_groups not in (None, row.a)
    return f"{row.setting}, GQA" if grouped else row.setting


def transformer_demo(out_dir: str | None = "ag-plots") -> list[ActivationRow]:
    """Print the activation bytes per layer of float16 transformer layers against the
    formulas, and plot measured against predicted (no plot when ``out_dir`` is None)."""
    rows = transformer_memory()
    print("Activation memory per transformer layer after its forward, float16 values, 1-byte masks")
    print("(measured: NumPy's buffers in tracemalloc, minus the output, plus the input;")
    print(" predicted: ag.memory_model, Korthikanti et al. 2022; g: key/value heads)")
    print()
    activation_table(rows)
    print()
    exact = sum(r.measured_bytes == r.predicted_bytes for r in rows)
    print(f"{exact} of {len(rows)} rows equal the formula to the byte. flash keeps selective's bytes")
    print("plus its logsumexp (4asb, float32); a full stack's rows are its bytes after the forward over L.")
    if out_dir is None:
        return rows
    _save_plot(out_dir, "transformer_memory.png", lambda plot, path: plot.measured_vs_predicted(
        activation_series(rows), path=path, title="Activations per transformer layer, float16: measured against formula"))
    return rows


# ---- the whole wall, and training on real data ----

def wall_table(bars: list[wall.WallBar]) -> None:
    """Print each bar's slices in MB, measured (formula), and the step's peak."""
    rows = [(bar.label, *(f"{bar.measured[s] / trace.MB:.2f} ({bar.predicted[s] / trace.MB:.2f})" for s in wall.SLICES),
             f"{bar.peak_bytes / trace.MB:.2f}") for bar in bars]
    table(["step", *(f"{s} MB" for s in wall.SLICES), "peak MB"], rows, left=1)


def wall_demo(out_dir: str | None = "ag-plots", levers=("mixed precision",), **sizes) -> list[wall.WallBar]:
    """Print one Adam step of a GPT-like model by slice at three sizes and two batch sizes, each
    measured beside its formula, with each lever of ``levers`` added in turn; plot the wall."""
    bars = wall.wall(levers=levers, **sizes)
    print("One training step (Adam, dropout 0.1) by slice: measured MB (formula MB), s = sequence length")
    print("(parameters and optimizer state at the step's end, gradients after backward, activations after")
    print(" the forward; ZeRO's accounting: 4 + 4 + 8 = 16 bytes a parameter, mixed 2 + 2 + 12 = 16)")
    print()
    wall_table(bars)
    exact = sum(bar.measured == bar.predicted for bar in bars)
    print(f"\n{exact} of {len(bars)} bars equal their formula to the byte in every slice.")
    if out_dir is not None:
        _save_plot(out_dir, "memory_wall.png", lambda plot, path: plot.memory_wall(
            [(bar.short_label, bar.measured, bar.predicted) for bar in bars], path=path,
            title="The whole wall: one training step by slice (ticks: formula)"))
    last = sizes.get("sizes", wall.SIZES)[-1], sizes.get("batches", (1, 4))[-1]
    wall_levers_demo(out_dir, *last, seq=sizes.get("seq", 64))
    return bars


LADDER = ("mixed precision", "ZeRO-1", "ZeRO-2", "ZeRO-3", "flash attention", "selective recomputation",
          "full recomputation", "offloading")


def wall_levers_demo(out_dir: str | None, size: tuple[int, int, int], batch: int, seq: int = 64,
                     levers: tuple[str, ...] = LADDER) -> list[wall.WallBar]:
    """Pull the levers one after another on one step, each on top of those before: print each slice
    measured (formula), the bytes each lever cut, and the peak; plot the bars."""
    bars = wall.wall(sizes=(size,), batches=(batch,), seq=seq, levers=levers)
    print(f"\nThe levers, one on top of another (ZeRO: rank 0 of 2, measured alone; offloading: full "
          "recomputation's checkpoints on disk)")
    rows, before = [], None
    for bar in bars:
        total = sum(bar.measured.values())
        cut = "" if before is None else f"{(before - total) / trace.MB:+.2f}"
        rows.append((bar.levers[-1] if bar.levers else "as is",
                     *(f"{bar.measured[s] / trace.MB:.2f} ({bar.predicted[s] / trace.MB:.2f})" for s in wall.SLICES),
                     cut, f"{bar.peak_bytes / trace.MB:.2f}"))
        before = total
    table(["lever added", *(f"{s} MB" for s in wall.SLICES), "cut MB", "peak MB"], rows, left=1)
    exact = sum(bar.measured == bar.predicted for bar in bars)
    print(f"\n{exact} of {len(bars)} bars equal their formula to the byte in every slice.")
    if out_dir is not None:
        _save_plot(out_dir, "memory_wall_levers.png", lambda plot, path: plot.memory_wall(
            [("as is" if not b.levers else "+" + b.levers[-1].split()[0], b.measured, b.predicted) for b in bars],
            path=path, title=f"{bars[0].label}: each lever on top of those before (ticks: formula)"))
    return bars


def train_demo(out_dir: str | None = "ag-plots", digits_steps: int = 500, text_steps: int = 300) -> dict:
    """Train the digits MLP and the character-level transformer with Adam, with progress bars;
    print the test accuracy and the loss, and plot the transformer's loss curve."""
    x, y, x_test, y_test = train.load_digits_split()
    mlp = train.DigitsMLP()
    mlp_opt = optim.Adam(list(mlp.parameters()), lr=1e-2)
    train.fit(train.digits_loss_at(mlp, x, y), mlp_opt, range(digits_steps), desc="digits")
    accuracy = train.accuracy(mlp, x_test, y_test)
    print(f"digits: {accuracy:.1%} of {len(y_test)} test images right after {digits_steps} steps")
    tokens, alphabet = train.encode(train.zen_text())
    model = train.CharTransformer(len(alphabet))
    opt = optim.Adam(list(model.parameters()), lr=3e-3)
    losses = train.fit(train.text_loss_at(model, tokens), opt, range(text_steps), desc="zen")
    print(f"zen of python: loss {losses[0]:.2f} → {np.mean(losses[-20:]):.2f} (ln {len(alphabet)} = "
          f"{np.log(len(alphabet)):.2f} is guessing)")
    if out_dir is not None:
        _save_plot(out_dir, "train_loss.png", lambda plot, path: plot.loss_curves(
            {"character-level transformer": losses}, path=path, title="A character-level transformer on the Zen of Python"))
    return {"accuracy": accuracy, "losses": losses}

