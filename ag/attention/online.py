"""The online softmax, the lecture's block merge: softmax over a row's blocks of columns, merged
from each block's result alone (exercise 3)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .shapes import check_block


@dataclass(frozen=True)
class SoftmaxBlock:
    """softmax over some columns of S, applied to their rows of V: o = Σ_j p_j v_j with
    p = exp(s - m) / l, m the row max and l = Σ exp(s - m) the row's normalizer."""

    o: np.ndarray
    m: np.ndarray
    l: np.ndarray


def softmax_block(s: np.ndarray, v: np.ndarray) -> SoftmaxBlock:
    """One block's softmax(s) @ v, with its row max ``m`` and normalizer ``l`` kept for merging."""
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)  # a row with nothing visible: p = 0, l = 0
    p = np.exp(s - m)
    l = np.sum(p, axis=-1, keepdims=True)
    o = np.divide(p @ v, l, out=np.zeros(p.shape[:-1] + v.shape[-1:], dtype=np.result_type(p, v)),
                  where=l != 0)
    return SoftmaxBlock(o, m, l)


def merge_softmax_blocks(a: SoftmaxBlock, b: SoftmaxBlock) -> SoftmaxBlock:
    """Softmax over the columns of both blocks, from the two results alone.

    m = max(m_a, m_b); each block's normalizer is rescaled to the new max,
    l = e^(m_a - m) l_a + e^(m_b - m) l_b, and o = (e^(m_a - m) l_a o_a + e^(m_b - m) l_b o_b) / l:
    each block's output weighted by its share of the normalizer (n1/(n1+n2) in the lecture).
    """
    ### BEGIN SOLUTION
    m = np.maximum(a.m, b.m)
    la, lb = np.exp(a.m - m) * a.l, np.exp(b.m - m) * b.l
    l = la + lb
    o = np.divide(la * a.o + lb * b.o, l, out=np.zeros_like(a.o), where=l != 0)
    ### END SOLUTION
    return SoftmaxBlock(o, m, l)


def online_softmax(s: np.ndarray, v: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """softmax(s, axis=-1) @ v computed block by block over the columns of s, never holding
    a whole row of P; returns the output and the row logsumexp m + log l."""
    check_block("online_softmax", "block_size", block_size)
    result = None
    for start in range(0, s.shape[-1], block_size):
        block = softmax_block(s[..., start:start + block_size], v[..., start:start + block_size, :])
        result = block if result is None else merge_softmax_blocks(result, block)
    with np.errstate(divide="ignore"):
        lse = (result.m + np.log(result.l))[..., 0]
    return result.o, lse
