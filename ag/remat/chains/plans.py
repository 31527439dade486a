"""Choosing which outputs of a chain to keep: ``plan(n, strategy, ...)``, from keeping all to the
fewest recomputed FLOPs under a memory budget (an exact dynamic program)."""
from __future__ import annotations

import functools
import math

import numpy as np

from .cost import ChainProfile, as_profile, predict


STRATEGIES = ("keep all", "keep none", "uniform", "block", "sqrt", "greedy", "optimal")
# the old names said what they recompute, so they read backwards: "none" kept every output
RENAMED = {"none": "keep all", "all": "keep none"}


def plan(n_layers: int, strategy: str, *, num_layers: int | None = None,
         budget_bytes: int | None = None, chain=None) -> list[int]:
    """The sorted layer indices whose outputs to keep (the input is always kept).

    - ``keep all``: keep every output;  ``keep none``: keep nothing but the input.
    - ``uniform`` (NeMo): cut the chain into blocks of ``num_layers`` and keep each block's input.
    - ``block`` (NeMo): recompute only the first ``num_layers`` layers, keep everything after.
    - ``sqrt`` (Chen et al. 2016): keep every ⌊√n⌋-th output.
    - ``greedy`` (Chen et al. 2016): close a segment when its bytes pass a threshold, the
      threshold searched so the predicted peak fits ``budget_bytes``.
    - ``optimal``: the fewest recomputed FLOPs whose predicted peak fits ``budget_bytes``
      (dynamic programming over the last kept output and the bytes kept so far; exact for
      the ``predict`` model; O(n² · P) time, P the number of Pareto-optimal (bytes, FLOPs)
      prefixes per position, at most n when all layers are the same size).

    ``greedy`` and ``optimal`` need ``chain`` (a ChainProfile or per-layer sizes) and
    ``budget_bytes``; their peak and budget are in ``predict``'s segment-mode terms.
    """
    if not isinstance(n_layers, (int, np.integer)) or n_layers < 1:
        raise ValueError(f"plan: n_layers must be a positive integer, got {n_layers!r}")
    if strategy not in STRATEGIES:
        renamed = f" (now {RENAMED[strategy]!r}: a name says what it keeps)" if strategy in RENAMED else ""
        raise ValueError(f"plan: unknown strategy {strategy!r}{renamed}; choose one of {', '.join(STRATEGIES)}")
    n = int(n_layers)
    if strategy == "keep all":
        return list(range(n))
    if strategy == "keep none":
        return []
    if strategy in ("uniform", "block"):
        k = _num_layers(strategy, num_layers, n)
        return _every(k, n) if strategy == "uniform" else list(range(k - 1, n))
    if strategy == "sqrt":
        ### BEGIN SOLUTION
        return _every(math.isqrt(n), n)
        ### END SOLUTION
    p = as_profile(chain) if chain is not None else None
    if p is None or budget_bytes is None:
        raise ValueError(f"plan: strategy {strategy!r} needs chain= (sizes or a ChainProfile) "
                         "and budget_bytes=")
    if p.n != n:
        raise ValueError(f"plan: chain describes {p.n} layers, n_layers is {n}")
    return _greedy(p, budget_bytes) if strategy == "greedy" else _optimal(p, budget_bytes)


def mode_for(strategy: str) -> str:
    """The replay mode a strategy assumes: the lecture's per-tensor recompute for ``keep none``."""
    if strategy in RENAMED:
        raise ValueError(f"mode_for: strategy {strategy!r} is now {RENAMED[strategy]!r} (a name says what it keeps)")
    return "tensor" if strategy == "keep none" else "segment"


def _num_layers(strategy: str, num_layers, n: int) -> int:
    if not isinstance(num_layers, (int, np.integer)) or not 1 <= num_layers <= n:
        raise ValueError(f"plan: strategy {strategy!r} needs num_layers in 1..{n}, got {num_layers!r}")
    return int(num_layers)


def _every(k: int, n: int) -> list[int]:
    """Outputs k-1, 2k-1, ...: the inputs of blocks of k layers (the chain's output is not one)."""
    return list(range(k - 1, n - 1, k))


def _greedy(p: ChainProfile, budget: int) -> list[int]:
    best = None
    for threshold in sorted({0} | set(np.cumsum(p.sizes).tolist()) | set(p.sizes)):  # 0 keeps all
        kept, run = [], 0
        for k, size in enumerate(p.sizes[:-1]):
            run += size
            if run > threshold:
                kept.append(k)
                run = 0
        cost = predict(p, kept)
        if cost.peak_bytes <= budget:
            key = (cost.recompute_flops, cost.peak_bytes)
            if best is None or key < best[0]:
                best = (key, kept)
    if best is None:
        raise ValueError(f"plan: greedy finds no plan whose predicted peak fits {budget:,} bytes")
    return best[1]


def _optimal(p: ChainProfile, budget: int) -> list[int]:
    """Dynamic programming over (last kept output c, bytes kept so far) with Pareto pruning."""
    s, f, n = p.sizes, p.costs, p.n
    # fronts[c]: Pareto-optimal (kept bytes, recompute FLOPs, kept list) with c the last kept
    fronts: dict[int, list[tuple[int, int, tuple[int, ...]]]] = {-1: [(0, 0, ())]}
    best = None
    ### BEGIN SOLUTION
    for c in range(-1, n):
        for kept_bytes, flops, kept in _pareto(fronts.get(c, [])):
            for j in range(c + 1, n + 1):  # j = n: keep nothing more
                local = _local_peak(s, c, j)
                if kept_bytes + local > budget:
                    continue
                run_cost = sum(f[c + 1:min(j, n - 1)])
                if j == n:
                    candidate = (flops + run_cost, kept)
                    if best is None or candidate[0] < best[0]:
                        best = candidate
                else:
                    fronts.setdefault(j, []).append((kept_bytes + s[j], flops + run_cost, kept + (j,)))
    ### END SOLUTION
    if best is None:
        raise ValueError(f"plan: no checkpoint plan has a predicted peak within {budget:,} bytes "
                         "(segment mode; see ag.remat.predict)")
    return list(best[1])


def _pareto(front):
    """Keep the entries no other entry beats on both kept bytes and FLOPs."""
    result, best_flops = [], None
    for entry in sorted(front):
        if best_flops is None or entry[1] < best_flops:
            result.append(entry)
            best_flops = entry[1]
    return result


def _local_peak(s: tuple[int, ...], c: int, j: int) -> int:
    """The peak over layers c+1..j beyond the bytes kept up to c, when c and j are kept
    (j = n: nothing kept after c): predict's segment-mode terms, step by step.

    ``_optimal`` asks for the same (c, j) once per Pareto entry, so the answers for every (c, j)
    of a chain are worked out together, O(n²) in all, and kept for the chain asked about last."""
    return _local_peaks(tuple(s))[c + 1][j - c - 1]


@functools.lru_cache(maxsize=1)
def _local_peaks(s: tuple[int, ...]) -> list[list[int]]:
    """``_local_peak(s, c, j)`` for every c in -1..n-1 and j in c+1..n, as rows[c + 1][j - c - 1].

    For one c, the forward's peak over layers c+1..j and the backward's over steps c+1..j-1 grow
    with j as running maxima; only step j itself, where j's kept output sits beside the replayed
    layers and the grads, is new for each j."""
    n = len(s)
    rows = []
    for c in range(-1, n):
        row, forward, backward, replayed = [], 0, 0, 0  # replayed: s[c+1] + ... + s[m-1]
        for m in range(c + 1, n):
            forward = max(forward, (s[m - 1] if m - 1 > c else 0) + s[m])
            grads = s[m] + (s[m - 1] if m > 0 else 0)
            row.append(max(forward, backward, s[m] + replayed + grads))  # j = m, kept
            backward = max(backward, replayed + grads)
            replayed += s[m]
        row.append(max(forward, backward))  # j = n: nothing kept after c
        rows.append(row)
    return rows
