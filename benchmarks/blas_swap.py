"""Would another BLAS, or a faster exp, speed up flash_attention? Its loops with torch's matmul, or
a compiled exp, in place of NumPy's.

    python benchmarks/blas_swap.py                  # N = 2048 and 4096, 3 turns each: about 2 min on 2 cores
    python benchmarks/blas_swap.py --sizes 1024 --repeats 5
    python benchmarks/blas_swap.py --swap exp       # exp_floor.py's AVX2 loop for NumPy's exp (needs cc)

A diagnosis, not a contestant: every tile product of ag's flash forward and backward runs on
torch's matmul (MKL on x86, one thread a worker) over the same NumPy buffers, zero-copy, while
everything else stays as it is. Where NumPy's BLAS is slower than torch's on the tiles alone (an
Intel Xeon: 1.4 to 1.7 ×), this says whether that gap reaches flash's time. On that Xeon it did
not (BENCHMARKS.md, "What limits"). The results differ from NumPy's only in float rounding, which
the script prints. B = 1, H = 8, d = 64, float32, standard normal, as in ``attention.py``.

``--swap exp`` puts ``exp_floor.py``'s plain AVX2 exp (compiled with ``cc`` on the spot) in place
of NumPy's for every in-place float32 exp of flash's loops, the one pass a score tile that flash
adds to its products. Where NumPy's exp is its AVX2 loop (Zen 3: a division and a masked store
every 8 floats, 3 to 6 × the plain loop's time), this says what a compiled exp would be worth.
ag does not ship such a loop (BENCHMARKS.md, "What limits").
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ag import Tensor  # noqa: E402
from ag.attention import backward, flash_attention, forward, tiles  # noqa: E402
from attention import _ints, machine_lines, make_inputs  # noqa: E402

LOOP_MODULES = (tiles, forward, backward)  # the modules whose ``np.matmul`` flash's loops call


def torch_numpy(torch) -> types.SimpleNamespace:
    """NumPy, except ``matmul``: torch's, on one thread in every calling thread, into ``out``."""
    def matmul(a, b, out=None):
        if torch.get_num_threads() != 1:  # the calling thread's OpenMP setting: one thread a worker
            torch.set_num_threads(1)
        product = torch.matmul(torch.from_numpy(np.asarray(a)), torch.from_numpy(np.asarray(b)),
                               out=None if out is None else torch.from_numpy(out))
        return out if out is not None else product.numpy()
    return types.SimpleNamespace(**{**vars(np), "matmul": matmul})


def c_exp_numpy() -> types.SimpleNamespace:
    """NumPy, except ``exp`` of a C-contiguous float32 array into itself (every exp pass of flash's
    loops on a score tile): exp_floor.py's plain AVX2 loop. ctypes lets go of the GIL during the call,
    so each worker runs its own. The library stays loaded once its folder is gone."""
    import tempfile

    from exp_floor import build_loops
    with tempfile.TemporaryDirectory() as workdir:
        loops, why = build_loops(workdir)
    if loops is None:
        raise SystemExit(f"--swap exp: exp_floor's C loop cannot run here: {why}")
    loop = loops["exp_plain"]

    def exp(x, out=None, **kwargs):
        if (out is x and not kwargs and isinstance(x, np.ndarray) and x.dtype == np.float32
                and x.flags.c_contiguous and x.size % 8 == 0):
            loop(x.ctypes.data, x.ctypes.data, x.size)
            return x
        return np.exp(x, out=out, **kwargs)
    return types.SimpleNamespace(**{**vars(np), "exp": exp})


SWAPS = {"matmul": "NumPy's / torch's matmul", "exp": "NumPy's exp / the C loop's"}


def flash_times(numpy_module, inputs, causal: bool, workers: int) -> tuple[float, float, tuple]:
    """Seconds of flash's forward alone and of a step (forward + backward), with ``numpy_module``
    in its loops; and the step's O and grads."""
    q, k, v, do = inputs
    for module in LOOP_MODULES:
        module.np = numpy_module
    try:
        start = time.perf_counter()
        flash_attention(q, k, v, causal=causal)
        forward_s = time.perf_counter() - start
        tensors = [Tensor(x, requires_grad=True) for x in (q, k, v)]
        start = time.perf_counter()
        out = flash_attention(*tensors, causal=causal)
        out.backward(do)
        step_s = time.perf_counter() - start
    finally:
        for module in LOOP_MODULES:
            module.np = np
    return forward_s, step_s, (out.value, *(t.grad for t in tensors))


def sdpa_times(torch, inputs, causal: bool, workers: int) -> tuple[float, float]:
    torch.set_num_threads(workers)
    q, k, v, do = (torch.from_numpy(x) for x in inputs)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    start = time.perf_counter()
    sdpa(q, k, v, is_causal=causal)
    forward_s = time.perf_counter() - start
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    start = time.perf_counter()
    sdpa(*leaves, is_causal=causal).backward(do)
    return forward_s, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=_ints, default=[2048, 4096])
    parser.add_argument("--repeats", type=int, default=3, help="turns of each contestant per row")
    parser.add_argument("--workers", type=int, default=None, help="flash's and torch's threads (default: the cores)")
    parser.add_argument("--swap", choices=list(SWAPS), default="matmul",
                        help="what runs in NumPy's place: torch's matmul, or a compiled AVX2 exp")
    args = parser.parse_args()
    import torch

    from ag.lab.threads import cores
    workers = args.workers or cores()
    swapped = torch_numpy(torch) if args.swap == "matmul" else c_exp_numpy()
    for line in machine_lines():
        print(line)
    print(f"workers: {workers}; medians of {args.repeats} turns, each after 0.2 s\n")
    print(f"| N | mask | torch SDPA forward ms | flash forward ms, {SWAPS[args.swap]} | "
          f"torch SDPA step ms | flash step ms, {SWAPS[args.swap]} | the same / torch SDPA, forward | "
          f"step | max difference |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        inputs = make_inputs(n)
        for causal in (False, True):
            got = flash_times(swapped, inputs, causal, workers)[2]
            want = flash_times(np, inputs, causal, workers)[2]
            differs = max(float(np.max(np.abs(a - b))) for a, b in zip(got, want))
            sdpa_times(torch, inputs, causal, workers)  # warm-up
            turns = {"numpy": [], "swapped": [], "sdpa": []}
            for _ in range(args.repeats):
                for name, run in (("numpy", lambda: flash_times(np, inputs, causal, workers)[:2]),
                                  ("swapped", lambda: flash_times(swapped, inputs, causal, workers)[:2]),
                                  ("sdpa", lambda: sdpa_times(torch, inputs, causal, workers))):
                    time.sleep(0.2)
                    turns[name].append(run())
            med = {name: np.median(np.array(t), axis=0) * 1e3 for name, t in turns.items()}
            ratios = (med["numpy"] / med["sdpa"], med["swapped"] / med["sdpa"])
            print(f"| {n} | {'causal' if causal else 'non-causal'} | {med['sdpa'][0]:.0f} | "
                  f"{med['numpy'][0]:.0f} / {med['swapped'][0]:.0f} | {med['sdpa'][1]:.0f} | "
                  f"{med['numpy'][1]:.0f} / {med['swapped'][1]:.0f} | {ratios[0][0]:.2f} / {ratios[1][0]:.2f} | "
                  f"{ratios[0][1]:.2f} / {ratios[1][1]:.2f} | {differs:.1e} |")


if __name__ == "__main__":
    main()
