"""Peak memory of one MLP training step as a student writes it, ag beside PyTorch CPU eager.

The model: ``n_layers`` layers ``h = relu(h @ w + b)`` (width ``width``; the last without the
ReLU), loss = mean of the last output; one step = forward + backward into every weight and bias.
ag runs it exactly so: no ``ag.linear``, no ``release_unneeded``. The engine frees what no
backward step reads once only the graph holds it (note 2, rule 7), as torch does.

    python benchmarks/mlp_memory.py            # batch 4096, width 1000, 10 layers, float32
    python benchmarks/mlp_memory.py --quick    # batch 512, width 256

Each framework runs in a fresh subprocess (``_memory.run_worker``): one warm-up step, then the
peak resident set during one step minus the resident set before it; ag's step is also measured
with tracemalloc (``ag.trace``), which cannot see torch's allocations. torch's step is
``torch.nn.Linear`` + ``torch.relu`` (benchmarks/mlp.py's ``TorchMLP``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ag  # noqa: E402
from _memory import rss_peak_of, run_worker  # noqa: E402
from mlp import TorchMLP, make_data  # noqa: E402

MB = 10**6
GOAL = 1.05  # ag / torch, peak of one step


def student_step(x: ag.Tensor, params) -> float:
    """The step as the lecture writes it: ``relu(h @ w + b)``, then the mean's backward."""
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = ag.relu(h)
    loss = ag.mean(h)
    del h
    loss.backward()
    return loss.item()


def ag_worker(batch: int, width: int, n_layers: int, dtype: str) -> dict:
    x, params = make_data(batch, width, n_layers, np.dtype(dtype))
    x = ag.Tensor(x)
    params = [(ag.Tensor(w, requires_grad=True), ag.Tensor(b, requires_grad=True)) for w, b in params]

    def zero_grad() -> None:
        for w, b in params:
            w.zero_grad()
            b.zero_grad()
    student_step(x, params)  # warm-up
    zero_grad()  # the step's grads count, for both frameworks and both methods
    rss, _ = rss_peak_of(lambda: student_step(x, params))
    zero_grad()
    ag.trace.start_trace()
    student_step(x, params)
    traced = ag.trace.snapshot_trace().peak_bytes
    ag.trace.end_trace()
    return {"rss": rss, "tracemalloc": traced}


def torch_worker(batch: int, width: int, n_layers: int, dtype: str) -> dict:
    model = TorchMLP(*make_data(batch, width, n_layers, np.dtype(dtype)))
    model.step()  # warm-up
    model.zero_grad()
    rss, _ = rss_peak_of(model.step)
    return {"rss": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="batch 512, width 256")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--worker", choices=("ag", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.batch, args.width = 512, 256
    shape = (args.batch, args.width, args.layers, args.dtype)
    if args.worker:
        worker = ag_worker if args.worker == "ag" else torch_worker
        print(json.dumps(worker(*shape)))
        return
    command = [sys.executable, os.path.abspath(__file__), "--batch", str(args.batch), "--width",
               str(args.width), "--layers", str(args.layers), "--dtype", args.dtype, "--worker"]
    mine = run_worker(command + ["ag"], "ag")
    torch = run_worker(command + ["torch"], "torch")
    print(f"MLP step, {args.layers} x relu(h @ w + b), width {args.width}, batch {args.batch}, {args.dtype}:")
    print(f"{'':24}{'peak MB':>10}{'/ torch (RSS)':>16}")
    print(f"{'ag (tracemalloc)':24}{mine['tracemalloc'] / MB:10.1f}{mine['tracemalloc'] / torch['rss']:16.3f}")
    print(f"{'ag (RSS)':24}{mine['rss'] / MB:10.1f}{mine['rss'] / torch['rss']:16.3f}")
    print(f"{'torch (RSS)':24}{torch['rss'] / MB:10.1f}{1:16.3f}")
    worst = max(mine["rss"], mine["tracemalloc"]) / torch["rss"]
    print(f"goal: ag / torch <= {GOAL}: {'met' if worst <= GOAL else 'missed'} ({worst:.3f})")


if __name__ == "__main__":
    main()
