"""The shapes, causal mask and scale of an attention call, checked: what every path shares (the
naive one, the online softmax, the tiled loops and the GPU kernels)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ops import ShapeError


@dataclass(frozen=True)
class Heads:
    """The shapes of one attention call, checked."""

    lead: tuple[int, ...]
    h: int
    h_kv: int
    n_q: int
    n_k: int
    d: int

    @property
    def group(self) -> int:
        return self.h // self.h_kv


def check_shapes(op: str, q, k, v) -> Heads:
    if q.ndim < 3 or k.ndim < 3 or v.ndim < 3:
        raise ShapeError(f"{op}: q, k and v need at least 3 dimensions (..., heads, tokens, head_dim), "
                         f"got shapes {q.shape}, {k.shape} and {v.shape}")
    if not (q.ndim == k.ndim == v.ndim):
        raise ShapeError(f"{op}: q, k and v must have the same rank, got shapes {q.shape}, {k.shape} "
                         f"and {v.shape}")
    if k.shape != v.shape:
        raise ShapeError(f"{op}: k and v must have the same shape, got {k.shape} and {v.shape}")
    if q.shape[:-3] != k.shape[:-3]:
        raise ShapeError(f"{op}: leading (batch) dimensions differ: q {q.shape} and k {k.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ShapeError(f"{op}: head dims differ: q has d = {q.shape[-1]}, k has d = {k.shape[-1]}")
    h, h_kv = q.shape[-3], k.shape[-3]
    if h_kv == 0 or h % h_kv:
        raise ShapeError(f"{op}: {h} query heads are not a multiple of {h_kv} key/value heads "
                         f"(shapes {q.shape} and {k.shape})")
    return Heads(tuple(q.shape[:-3]), h, h_kv, q.shape[-2], k.shape[-2], q.shape[-1])


def check_causal(op: str, causal) -> None:
    if causal not in (False, True, "top_left", "bottom_right"):
        raise ValueError(f"{op}: causal must be False, True ('top_left') or 'bottom_right', got {causal!r}")


def visible_keys(causal, rows: np.ndarray, cols: np.ndarray, n_q: int, n_k: int) -> np.ndarray | None:
    """Boolean (rows, cols) array: may query ``rows[i]`` see key ``cols[j]``? None when all can."""
    if not causal:
        return None
    offset = n_k - n_q if causal == "bottom_right" else 0
    return cols[None, :] <= rows[:, None] + offset


def softmax_scale(scale, d: int) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def check_block(op: str, name: str, size) -> None:
    if not isinstance(size, (int, np.integer)) or size <= 0:
        raise ValueError(f"{op}: {name} must be a positive integer, got {size!r}")
