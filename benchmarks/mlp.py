"""Time and memory of one training step of a ReLU MLP: ag against PyTorch CPU eager.

The model: ``n_layers`` Linear layers (``h @ w + b``, width ``width``), ReLU between them,
loss = mean of the last output; one step = forward + backward into every weight and bias.

    python benchmarks/mlp.py            # batch 4096, width 1000, 10 layers, float32 and float64
    python benchmarks/mlp.py --quick    # a smaller model, a few seconds

Time is the median (and the best) of ``--repeats`` steps after a warm-up, ag and torch
taking turns in the same process, so that drift in the machine's speed hits both alike.
ag's step runs on both paths side by side: the classroom's (the default) and with ``ag.lab`` on.
The step's products are also timed alone with the same shapes: on NumPy's BLAS, as ag runs them
(on both paths: the lab's large ones in row blocks on its threads) and on torch's matmul, so that
a missed time goal says whether the BLAS, the lab's blocks or the rest of the step limits it.
``--profile`` shows where a step's time goes instead (cProfile for ag, torch.profiler).

Memory is measured in a fresh subprocess per framework and dtype, the same way for both:
the peak resident set (VmHWM, reset through /proc/self/clear_refs) during one step minus
the resident set just before it, with glibc's mmap threshold fixed so that every large
array is mapped on allocation and unmapped on free (RSS then follows the live bytes).
ag's step is also measured with tracemalloc (``ag.trace``), which cannot see torch's allocations.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import glob
import json
import os
import statistics
import sys
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ag  # noqa: E402
from _timing import take_turns  # noqa: E402
from _busy import busy_report  # noqa: E402
from _goals import goal, shown, verdict  # noqa: E402
from _memory import rss_peak_of, run_workers  # noqa: E402

MB = 10**6
TIME_GOAL = 1.10  # ag / torch, the classroom path (the default)
LAB_TIME_GOAL = 1.00  # ag / torch with ag.lab on
MEMORY_GOAL = 1.00
MEMORY_RESOLUTION = 0.005  # RSS peaks of the same step differ by ~0.1 MB in 184 MB between runs


# ---- the model, the same weights for both frameworks ----

def make_data(batch: int, width: int, n_layers: int, dtype, seed: int = 0):
    """Input x (batch, width) and ``n_layers`` pairs w (in, out), b (out,), He-initialised."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, width)).astype(dtype)
    params = [((rng.standard_normal((width, width)) * np.sqrt(2 / width)).astype(dtype),
               (rng.standard_normal(width) * 0.01).astype(dtype)) for _ in range(n_layers)]
    return x, params


class AgMLP:
    """The MLP in ag: after each layer, ``release_unneeded`` drops what no backward step reads."""

    def __init__(self, x: np.ndarray, params) -> None:
        self.x = ag.Tensor(x)
        self.params = [(ag.Tensor(w.copy(), requires_grad=True), ag.Tensor(b.copy(), requires_grad=True))
                       for w, b in params]

    def zero_grad(self) -> None:
        for w, b in self.params:
            w.zero_grad()
            b.zero_grad()

    def step(self) -> float:
        self.zero_grad()
        h = self.x
        for i, (w, b) in enumerate(self.params):
            z = ag.linear(h, w, b)  # one buffer, like torch.nn.Linear (addmm)
            out = ag.relu(z) if i < len(self.params) - 1 else z
            ag.release_unneeded([out], [h])
            h = out
        loss = ag.mean(h)
        ag.release_unneeded([loss], [self.x])
        loss.backward()
        return loss.item()

    def grads(self) -> list[np.ndarray]:
        return [g for w, b in self.params for g in (w.grad, b.grad)]


class TorchMLP:
    """The same MLP in PyTorch eager: ``torch.nn.Linear`` layers holding the same weights."""

    def __init__(self, x: np.ndarray, params) -> None:
        import torch
        self.torch = torch
        self.x = torch.from_numpy(x.copy())
        self.layers = []
        for w, b in params:
            layer = torch.nn.Linear(w.shape[0], w.shape[1], dtype=self.x.dtype)
            with torch.no_grad():
                layer.weight.copy_(torch.from_numpy(w.T.copy()))
                layer.bias.copy_(torch.from_numpy(b))
            self.layers.append(layer)

    def zero_grad(self) -> None:
        for layer in self.layers:
            layer.weight.grad = None
            layer.bias.grad = None

    def step(self) -> float:
        self.zero_grad()
        loss = self._forward().mean()
        loss.backward()
        return loss.item()

    def _forward(self):
        h = self.x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = self.torch.relu(h)
        return h

    def grads(self) -> list[np.ndarray]:
        return [g for layer in self.layers
                for g in (layer.weight.grad.numpy().T, layer.bias.grad.numpy())]


# ---- time ----


def check_same_result(a: AgMLP, t: TorchMLP) -> float:
    """Largest relative difference between ag's and torch's grads, after one step each."""
    loss_a, loss_t = a.step(), t.step()
    worst = abs(loss_a - loss_t) / max(abs(loss_t), 1e-30)
    for ga, gt in zip(a.grads(), t.grads()):
        worst = max(worst, float(np.max(np.abs(ga - gt)) / max(np.max(np.abs(gt)), 1e-30)))
    return worst


def products_alone(triples: list[tuple[np.ndarray, np.ndarray, np.ndarray]], times: int = 1,
                   no_input_grad: frozenset[int] = frozenset()) -> dict[str, Callable[[], object]]:
    """Products of linear maps alone, the same arrays and layouts three ways: on NumPy's BLAS in one
    call each ("numpy products"), as ag's ops run them ("ag products": one np.matmul each on the
    classroom path; with the lab on, a large one in row blocks on its threads, one BLAS thread each,
    ``ag.set_workers``) and on torch's matmul ("torch products"). For each (x, w, dy): x w, then
    dy wᵀ (the input's grad, unless its index is in ``no_input_grad``) and xᵀ dy (the weight's
    grad); all of it ``times`` over. Stacks of matrices work too (w and dy transposed in their last
    two axes)."""
    import torch
    tensors = [tuple(torch.from_numpy(a) for a in triple) for triple in triples]
    wrapped = [tuple(ag.Tensor(a) for a in triple) for triple in triples]

    def run(triples, matmul, transposed):
        for _ in range(times):
            for i, (x, w, dy) in enumerate(triples):
                matmul(x, w)
                if i not in no_input_grad:
                    matmul(dy, transposed(w))
                matmul(transposed(x), dy)
    return {"numpy products": lambda: run(triples, np.matmul, lambda z: np.swapaxes(z, -1, -2)),
            "ag products": lambda: run(wrapped, ag.matmul, lambda z: ag.Tensor(np.swapaxes(z.value, -1, -2))),
            "torch products": lambda: run(tensors, torch.matmul, lambda z: z.transpose(-1, -2))}


def products(x: np.ndarray, params) -> dict[str, Callable[[], object]]:
    """The step's products alone (``products_alone``): per layer h w, hᵀ dz and, above the first
    layer (x needs no grad), dz wᵀ; values do not change a product's time, so h and dz are ones."""
    ones = np.ones_like(x)
    return products_alone([(x if i == 0 else ones, w, ones) for i, (w, _) in enumerate(params)],
                          no_input_grad=frozenset({0}))


# ---- memory, in a fresh subprocess per framework and dtype ----

def memory_worker(framework: str, dtype: str, batch: int, width: int, n_layers: int) -> dict:
    x, params = make_data(batch, width, n_layers, np.dtype(dtype))
    model = AgMLP(x, params) if framework == "ag" else TorchMLP(x, params)
    del x, params
    model.step()  # warm-up: BLAS buffers, thread pools, lazy initialisation
    model.zero_grad()
    result = {}
    result["rss_peak"], result["rss_after"] = rss_peak_of(model.step)
    if framework == "ag":
        model.zero_grad()
        gc.collect()
        ag.trace.start_trace()
        try:
            model.step()
            result["tracemalloc_peak"] = ag.trace.snapshot_trace().peak_bytes
        finally:
            ag.trace.end_trace()
    return result


def memory_command(framework: str, dtype: str, args) -> tuple[list[str], str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-worker", framework, dtype,
           "--batch", str(args.batch), "--width", str(args.width), "--layers", str(args.layers)]
    return cmd, f"{framework} {dtype}"


# ---- the machine ----

def numpy_blas_threads() -> tuple[int, str]:
    """(threads, how we know) for NumPy's BLAS: threadpoolctl, else OpenBLAS itself, else os.cpu_count."""
    try:
        import threadpoolctl
        info = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
        if info:
            return info[0]["num_threads"], f"threadpoolctl ({info[0].get('internal_api')})"
    except ImportError:
        pass
    libdir = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in glob.glob(os.path.join(libdir, "*openblas*")):
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                     "openblas_get_num_threads"):
            if hasattr(lib, name):
                return getattr(lib, name)(), f"OpenBLAS {name}()"
    return os.cpu_count() or 1, "os.cpu_count() (threadpoolctl not installed)"


def busy_limit() -> str:
    """What a step missing the busy-machine goal waits on: the threads it runs on against the free cores."""
    return (f"NumPy's BLAS on {numpy_blas_threads()[0]} threads, the lab's {ag.lab.workers()} workers, "
            f"{os.cpu_count()} cores of which one is busy")


def numpy_blas_name() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001 (older NumPy has no dict mode)
        return "unknown"


def numpy_blas_kernels() -> str:
    """Which kernels NumPy's OpenBLAS runs (its 'architecture'), and whether the environment chose
    them: OPENBLAS_CORETYPE overrides OpenBLAS's own pick, e.g. AVX2 kernels on an AVX-512 CPU."""
    try:
        import threadpoolctl
        info = [i for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"]
    except ImportError:
        return "unknown (threadpoolctl not installed)"
    kernels = (info[0].get("architecture") or "unknown") if info else "not OpenBLAS"
    forced = os.environ.get("OPENBLAS_CORETYPE")
    return f"{kernels} (set by OPENBLAS_CORETYPE={forced})" if forced else f"{kernels} (OpenBLAS's own pick)"


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name with its family and model numbers and whether it has AVX-512: machines
    of one kind name their CPUs alike ("AMD EPYC") and still differ (family 25 is Zen 3 or Zen 4,
    26 is Zen 5), and OpenBLAS picks its kernels by them."""
    import platform
    try:
        with open(cpuinfo) as f:
            fields = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
    except OSError:
        return platform.processor() or "?"
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    name = fields.get("model name", platform.processor() or "?")
    avx512 = "AVX-512" if "avx512f" in fields.get("flags", "").split() else "no AVX-512"
    return f"{name} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')}, {avx512})"


def cpu_line() -> str:
    """The CPU, its logical CPUs, and how many of them this process may use where that is fewer."""
    from ag.lab.threads import cores
    usable = cores()
    return (f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs"
            + (f", {usable} of them for this process (its CPU affinity)" if usable != os.cpu_count() else ""))


def machine_lines() -> list[str]:
    import platform

    import torch
    threads, how = numpy_blas_threads()
    return [
        cpu_line(),
        f"Python {platform.python_version()}, numpy {np.__version__} (BLAS: {numpy_blas_name()}), "
        f"torch {torch.__version__}",
        f"threads: numpy BLAS {threads} [{how}], torch.get_num_threads() {torch.get_num_threads()}",
        f"numpy's BLAS kernels: {numpy_blas_kernels()}",
    ]


# ---- tables ----

def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    print(f"\n{title}\n")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(str(c).rjust(w) for c, w in zip(row, widths)) + " |")


def in_lab(run: Callable[[], object]) -> Callable[[], object]:
    """``run`` with ``ag.lab`` on."""
    def lab_run():
        with ag.lab.on():
            return run()
    return lab_run


def classroom(run: Callable[[], object]) -> Callable[[], object]:
    """``run`` with ``ag.lab`` off, whatever the script switched on."""
    def classroom_run():
        was = ag.lab.enabled()
        ag.lab.disable()
        try:
            return run()
        finally:
            if was:
                ag.lab.enable()
    return classroom_run


def busy_rows(dtype: str, args) -> None:
    """``--busy``: the classroom's step, the lab's and torch's, idle and with one core busy."""
    x, params = make_data(args.batch, args.width, args.layers, np.dtype(dtype))
    a, t = AgMLP(x, params), TorchMLP(x, params)
    busy_report(f"MLP {dtype} step", {"ag": a.step, "ag lab": in_lab(a.step), "torch": t.step},
                args.repeats, busy_limit(), print_table)


def time_row(dtype: str, args) -> tuple[list[str], str]:
    """The time table's row for one dtype, and what limits the classroom step's time (``time_limit``);
    the lab's columns last."""
    x, params = make_data(args.batch, args.width, args.layers, np.dtype(dtype))
    a, t = AgMLP(x, params), TorchMLP(x, params)
    worst = check_same_result(a, t)  # also the warm-up step of each
    worst = max(worst, in_lab(lambda: check_same_result(a, t))())
    alone = products(x, params)
    alone["lab products"] = in_lab(alone["ag products"])
    for run in alone.values():
        run()  # warm-up
    times = take_turns({"ag": a.step, "ag lab": in_lab(a.step), "torch": t.step, **alone}, args.repeats)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}
    ratio = med["ag"] / med["torch"]
    limit = time_limit(3 * args.layers - 1, *(med[name] * 1e3 for name in
                                              ("ag", "torch", "numpy products", "torch products", "ag products")))
    return [dtype, f"{med['ag'] * 1e3:.0f}", f"{med['torch'] * 1e3:.0f}", shown(ratio, TIME_GOAL),
            verdict(ratio, TIME_GOAL), f"{best['ag'] * 1e3:.0f}", f"{best['torch'] * 1e3:.0f}",
            f"{best['ag'] / best['torch']:.2f}", f"{med['numpy products'] * 1e3:.1f}",
            f"{med['ag products'] * 1e3:.1f}", f"{med['torch products'] * 1e3:.1f}", f"{worst:.1e}",
            f"{med['ag lab'] * 1e3:.0f}", shown(med["ag lab"] / med["torch"], LAB_TIME_GOAL),
            f"{med['lab products'] * 1e3:.1f}"], limit


def memory_row(dtype: str, args) -> list[str]:
    mem = run_workers({f: memory_command(f, dtype, args) for f in ("ag", "torch")})
    mem_a, mem_t = mem["ag"], mem["torch"]
    ratio = mem_a["rss_peak"] / mem_t["rss_peak"]
    return [dtype, f"{mem_a['tracemalloc_peak'] / MB:.1f}", f"{mem_a['rss_peak'] / MB:.1f}",
            f"{mem_t['rss_peak'] / MB:.1f}", shown(ratio, MEMORY_GOAL, MEMORY_RESOLUTION, digits=3),
            verdict(ratio, MEMORY_GOAL, MEMORY_RESOLUTION),
            f"{mem_a['rss_after'] / MB:.0f} / {mem_t['rss_after'] / MB:.0f}"]


def profile(dtype: str, args, steps: int = 3) -> None:
    """Where a step's time goes: cProfile of ag (a closure's time includes its NumPy work), torch.profiler."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    x, params = make_data(args.batch, args.width, args.layers, np.dtype(dtype))
    a, t = AgMLP(x, params), TorchMLP(x, params)
    a.step(), t.step()
    print(f"\nag, {steps} steps, {dtype}, by own time (ag/ops/*.py:N(_backward) is that op's backward):")
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [a.step() for _ in range(steps)])
    pstats.Stats(profiler).sort_stats("tottime").print_stats(8)
    print(f"torch, {steps} steps, {dtype}, by self CPU time:")
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            t.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


def time_limit(count: int, ag_ms: float, torch_ms: float, numpy_products: float, torch_products: float,
               ag_products: float) -> str:
    """What a missed time goal of the classroom's step is limited by, from the step's products timed
    alone (``products_alone``): NumPy's BLAS, where one call each is slower than torch's matmul; else
    ag's matmul around the product, where the products as ag runs them are slower than both; else the
    rest of the step."""
    blas = f"{numpy_blas_name()}, {numpy_blas_kernels()}"
    share = f"the step's {count} products alone take {numpy_products:.1f} ms of ag's {ag_ms:.0f} on NumPy's BLAS"
    rest = f"{ag_ms - ag_products:.1f} ms outside them against torch's {torch_ms - torch_products:.1f}"
    if numpy_products > torch_products * 1.02:
        return (f"{share} ({blas}) and {torch_products:.1f} ms on torch's matmul, "
                f"{numpy_products / torch_products:.2f} x: the BLAS first ({ag_products:.1f} ms as ag runs "
                f"them; {rest})")
    if ag_products > max(numpy_products, torch_products) * 1.02:
        return (f"{share}, no slower than torch's matmul ({torch_products:.1f} ms), but {ag_products:.1f} ms "
                f"as ag's matmul runs them, one np.matmul each on Tensors "
                f"({ag_products / numpy_products:.2f} x one call on NumPy's BLAS): ag's op around the product "
                f"first ({rest})")
    return (f"{share}, no slower than torch's matmul ({torch_products:.1f} ms), {ag_products:.1f} ms as ag runs "
            f"them: the rest of ag's step, {rest}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="batch 512, width 256, 3 repeats")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--profile", action="store_true", help="only profile ag and torch steps, first dtype")
    parser.add_argument("--busy", action="store_true", help="only the steps idle and with one core kept busy")
    parser.add_argument("--memory-worker", nargs=2, metavar=("FRAMEWORK", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        print(json.dumps(memory_worker(*args.memory_worker, args.batch, args.width, args.layers)))
        return
    if args.quick:
        args.batch, args.width, args.repeats = 512, 256, 3
    dtypes = args.dtypes.split(",")
    print(f"MLP step: {args.layers} x Linear({args.width}, {args.width}) + ReLU, batch {args.batch}, "
          f"loss = mean(output), forward + backward")
    for line in machine_lines():
        print(line)
    print(f"load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          "(other processes on the machine slow both frameworks and add noise)")
    if args.profile:
        profile(dtypes[0], args)
        return
    if args.busy:
        for dtype in dtypes:
            busy_rows(dtype, args)
        return

    time_rows, memory_rows, limits = [], [], []
    for dtype in dtypes:
        row, limit = time_row(dtype, args)
        time_rows.append(row)
        limits.append(limit)
        gc.collect()
        if not args.no_memory:
            memory_rows.append(memory_row(dtype, args))

    print_table(f"Time per step (median and best of {args.repeats} after a warm-up; "
                f"goal: median ag/torch <= {TIME_GOAL:.2f} on the classroom path, <= {LAB_TIME_GOAL:.2f} "
                "with the lab on)",
                ["dtype", "ag ms", "torch ms", "ag/torch", "goal", "best ag ms", "best torch ms",
                 "best ag/torch", "its products: NumPy ms", "as ag runs them", "torch ms", "max rel. grad diff",
                 "ag lab ms", "lab/torch", "lab's products ms"],
                time_rows)
    if memory_rows:
        print_table(f"Peak memory of one step (goal ag/torch <= {MEMORY_GOAL:.2f}, "
                    f"within the method's resolution of {MEMORY_RESOLUTION:.1%})",
                    ["dtype", "ag tracemalloc MB", "ag RSS MB", "torch RSS MB", "ag/torch (RSS)", "goal",
                     "kept after step ag / torch MB"], memory_rows)
        print(MEMORY_METHOD)
    print()
    for row, limit in zip(time_rows, limits):
        goal(f"MLP {row[0]} step time, ag / torch (median)", float(row[3]), TIME_GOAL, limited_by=limit)
        goal(f"MLP {row[0]} step time with the lab on, ag / torch (median)", float(row[13]), LAB_TIME_GOAL,
             limited_by="see the lab's products column and docs/lab.md")
    for row in memory_rows:
        goal(f"MLP {row[0]} step peak, ag / torch (RSS)", float(row[4]), MEMORY_GOAL,
             resolution=MEMORY_RESOLUTION, limited_by="the temporaries of ag's backward")


MEMORY_METHOD = """
Method: each framework and dtype in a fresh subprocess, one warm-up step, then the peak
resident set during one step (VmHWM after resetting it via /proc/self/clear_refs) minus the
resident set before it; MALLOC_MMAP_THRESHOLD_=131072 so large buffers are unmapped when freed.
Weights and input exist before the step; the step creates the grads (they count, and are
'kept after step'). tracemalloc sees NumPy but not torch, so it is shown for ag only."""


if __name__ == "__main__":
    main()
