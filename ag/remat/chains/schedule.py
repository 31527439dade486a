"""A chain plan as a schedule on the chain's graph, so that the one memory model
(``graphs.model.simulate``) prices it: ``chain_graph`` is a chain seen as a graph (node k reads
node k-1), ``sequential_matrices`` the R and S matrices of what ``sequential`` runs.

Chain terms: node k is layer k's output x_k; backward step m (m = n-1 down to 0) reads x_{m-1}
(the chain's input x_{-1} is data, not a node), holds x_m's grad and makes x_{m-1}'s. What
``sequential`` does, stage by stage:

- forward: x_k is made from x_{k-1}; a non-kept x_{k-1} goes as soon as x_k exists;
- a kept output lives until its own backward step is done: the engine holds a value it did
  not discard, so on the graph that step reads it too;
- segment mode: the first step that reads a gone value replays the run of layers from the
  nearest kept output up to it, and keeps each replayed value until the step that reads it;
- tensor mode: each step that reads a gone value replays the run up to it, keeping only it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..graphs.graph import BackwardStep, Call, Graph, Node


def _not_runnable(*args, **kwargs):
    raise TypeError("a chain's graph is for pricing: run the chain with sequential")


def chain_graph(sizes: Sequence[int], costs: Sequence[int], kept: set[int] = frozenset()) -> Graph:
    """The chain x_k = layer_k(x_{k-1}) as a graph: node k has ``sizes[k]`` bytes and ``costs[k]``
    FLOPs; step m reads x_{m-1} (and x_m if kept), holds x_m's grad (``grad_bytes`` = s_m) and
    makes x_{m-1}'s (``extra_bytes``)."""
    n = len(sizes)
    nodes = [Node(index=k, op=f"layer {k}", shape=(), dtype=np.dtype(np.uint8), bytes=int(sizes[k]),
                  hidden_bytes=0, flops=int(costs[k]), deps=(k - 1,) if k > 0 else (), view_of=None,
                  has_backward=True, scope=(), call=Call(_not_runnable, (), {}))
             for k in range(n)]
    steps = [BackwardStep(node=m, reads=((m - 1,) if m > 0 else ()) + ((m,) if m in kept else ()),
                          grad_bytes=int(sizes[m]), extra_bytes=int(sizes[m - 1]) if m > 0 else 0)
             for m in range(n - 1, -1, -1)]
    return Graph(nodes, steps, leaves=[], loss=n - 1)


def sequential_matrices(n: int, kept: set[int], mode: str = "segment") -> tuple[np.ndarray, np.ndarray]:
    """R and S of what ``sequential(layers, x, kept, mode=mode)`` runs on n layers (``chain_graph``'s stages)."""
    T = 2 * n
    R = np.zeros((T, n), dtype=bool)
    S = np.zeros((T, n), dtype=bool)
    for k in range(n):
        R[k, k] = True
        if k + 1 < n:
            S[k + 1, k] = True  # layer k+1 reads it
        if k in kept:
            S[k + 1:stage_of(n, k) + 1, k] = True
    for m in range(n - 1, 0, -1):
        if m - 1 not in kept and not S[stage_of(n, m), m - 1]:
            _replay(R, S, n, kept, m, mode)
    return R, S


def stage_of(n: int, m: int) -> int:
    """The stage of backward step m (step n-1 runs first, in stage n)."""
    return 2 * n - 1 - m


def _replay(R: np.ndarray, S: np.ndarray, n: int, kept: set[int], m: int, mode: str) -> None:
    """Step m reads x_{m-1}, which is gone: replay layers start+1..m-1 from the nearest kept
    output; segment mode keeps each value x_i until step i+1 reads it."""
    start = max([c for c in kept if c < m - 1], default=-1)
    t = stage_of(n, m)
    R[t, start + 1:m] = True
    if mode == "segment":
        for i in range(start + 1, m - 1):
            S[t + 1:stage_of(n, i + 1) + 1, i] = True
