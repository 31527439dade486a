"""The lecture's demos, as functions that return what they measured and print it as tables.

``ag demo memory`` runs ``memory()``; notebooks and tests call the pieces directly.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from . import trace
from .ops import matmul, sum
from .tensor import Tensor, eager_grads

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
    rng = np.random.default_rng(seed)
    with eager_grads(eager):
        weights = [Tensor(rng.standard_normal((width, width)) / np.sqrt(width), requires_grad=True)
                   for _ in range(n_layers)]
        x = Tensor(rng.standard_normal((batch, width)))
        trace.start_trace()
        try:
            forward = []
            for w in weights:
                x = matmul(x, w)
                forward.append(trace.snapshot_trace("matmul", "forward"))
            loss = sum(x)
            del x
            backward = loss.backward(trace=True)
        finally:
            trace.end_trace()
    return ChainRun(forward, backward)


def _mb_row(snapshots: list[trace.Snapshot]) -> str:
    return ", ".join(str(s.allocated_mb) for s in snapshots)


def memory() -> None:
    """Print every number of the lecture's memory part, measured now."""
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
    print(f"   peak of the whole run (tracemalloc): before {before.backward[-1].peak_bytes // trace.MB} MB, "
          f"after {after.backward[-1].peak_bytes // trace.MB} MB")
    print("   after: each intermediate's grad is freed once its own backward step has run,")
    print("   and its value once nothing left in the graph reads it.")
