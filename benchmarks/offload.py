"""Offloading against recomputing against keeping everything, at one budget, and the rates that decide it.

    python benchmarks/offload.py            # 16 layers y = tanh(x W), 4096 x 1024 float32 outputs (16 MiB each)
    python benchmarks/offload.py --quick    # 2048 x 512 (4 MiB each)
    python benchmarks/offload.py --device gpu --quick   # on CuPy: outputs offloaded to host memory over PCIe

Prints this machine's disk write and read rate (np.memmap and np.fromfile of one output, which the page cache
may serve), its memcpy rate and its matmul FLOP rate; then each way's peak (tracemalloc) and step time; then the
arithmetic: seconds to move an output out and back (2·bytes / rate) against seconds to recompute it (FLOPs / rate).
With ``--device gpu`` the rates are device to host and host to device (``.get()``, ``cupy.asarray``) and the
device's matmul, and the peaks are CuPy's memory pool's.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ag  # noqa: E402
from ag import offload  # noqa: E402
from ag.tables import table  # noqa: E402


def best_seconds(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def rates(rows: int, h: int) -> dict[str, float]:
    """Bytes/s to disk and back, bytes/s of memcpy, FLOP/s of one layer's matmul, on one output's size."""
    value = np.random.default_rng(0).standard_normal((rows, h)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((h, h)).astype(np.float32)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "x.bin"

        def write():
            disk = np.memmap(path, dtype=value.dtype, mode="w+", shape=value.shape)
            disk[...] = value
            disk.flush()
            del disk
        write_s = best_seconds(write)
        read_s = best_seconds(lambda: np.fromfile(path, dtype=value.dtype))
    copy_s = best_seconds(lambda: value.copy())
    matmul_s = best_seconds(lambda: value @ w)
    return {"disk write B/s": value.nbytes / write_s, "disk read B/s": value.nbytes / read_s,
            "memcpy B/s": value.nbytes / copy_s, "matmul FLOP/s": 2 * rows * h * h / matmul_s}


def gpu_rates(rows: int, h: int) -> dict[str, float]:
    """Bytes/s device to host and back (PCIe, pageable host memory), and the device's matmul FLOP/s."""
    import cupy
    value = cupy.asarray(np.random.default_rng(0).standard_normal((rows, h)).astype(np.float32))
    w = cupy.asarray(np.random.default_rng(1).standard_normal((h, h)).astype(np.float32))
    host = value.get()

    def synced(fn):
        return lambda: (fn(), cupy.cuda.Device().synchronize())
    to_host_s = best_seconds(synced(value.get))
    to_device_s = best_seconds(synced(lambda: cupy.asarray(host)))
    matmul_s = best_seconds(synced(lambda: value @ w))
    return {"device to host B/s": value.nbytes / to_host_s, "host to device B/s": value.nbytes / to_device_s,
            "matmul FLOP/s": 2 * rows * h * h / matmul_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    args = parser.parse_args()
    rows, h = (2048, 512) if args.quick else (4096, 1024)
    put = np.asarray
    if args.device == "gpu":
        try:
            import cupy
        except ImportError:
            sys.exit("benchmarks/offload.py --device gpu needs CuPy and a GPU: pip install 'ag[gpu]'")
        put = cupy.asarray
    rng = np.random.default_rng(0)
    weights = [ag.Tensor(put((rng.standard_normal((h, h)) / np.sqrt(h)).astype(np.float32)), requires_grad=True)
               for _ in range(args.layers)]
    layers = [lambda t, w=w: ag.tanh(t @ w) for w in weights]
    x = ag.Tensor(put(rng.standard_normal((rows, h)).astype(np.float32)))
    one = rows * h * 4
    measured = rates(rows, h) if args.device == "cpu" else gpu_rates(rows, h)
    table(["rate", "value"], [[k, f"{v / 1e9:.2f} G"] for k, v in measured.items()])
    budget = 10 * one
    found = offload.compare(layers, x, budget_bytes=budget, device=args.device)
    print(f"\n{args.layers} layers, one output {one / 2**20:.0f} MiB, budget {budget / 2**20:.0f} MiB "
          "(remat.plan 'optimal', predict's terms)")
    table(["way", "peak MiB", "peak / one output", "step s"],
          [[way, f"{r['peak_bytes'] / 2**20:.0f}", f"{r['peak_bytes'] / one:.1f}", f"{r['seconds']:.3f}"]
           for way, r in found.items()])
    out, back = ("disk write B/s", "disk read B/s") if args.device == "cpu" else ("device to host B/s",
                                                                                  "host to device B/s")
    move = one / measured[out] + one / measured[back]
    recompute = 2 * rows * h * h / measured["matmul FLOP/s"]
    print(f"\none output: writing it out and reading it back takes {move * 1e3:.1f} ms; "
          f"recomputing its matmul {recompute * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
