"""FlashAttention-2's forward, Algorithm 1, on NumPy, with the paper's running max (exercise 4)."""
from __future__ import annotations

import numpy as np

from .tiles import Tiles, forward_outputs


def tiled_forward(tiles: Tiles, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  out=None) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1: for each query tile, stream the key/value tiles through m_i, l_i and acc;
    return O and the row logsumexp L = m_i + log l_i. Dropout (``tiles.dropout``) reaches only acc:
    l_i and L are of the undropped P, as in FlashAttention. ``out`` gives (O, L) to fill, zeroed and
    -inf (a worker's views of the whole call's); else they are allocated here."""
    h = tiles.heads
    qg, kg, vg = tiles.grouped(q, h.group), tiles.grouped(k, 1), tiles.grouped(v, 1)
    o, lse = out or forward_outputs(q, k, v, tiles.lse_dtype(np.result_type(q, k, v)))
    og, lse_g = tiles.grouped(o, h.group), tiles.grouped(lse[..., None], h.group)[..., 0]
    dtype = og.dtype
    for q_start in range(0, h.n_q, tiles.block_q):
        rows = slice(q_start, q_start + tiles.block_q)
        q_i = tiles.scaled_queries(qg, rows)
        ### BEGIN SOLUTION
        m_i = np.full(q_i.shape[:-1] + (1,), -np.inf, dtype=dtype)
        l_i = np.zeros_like(m_i)
        acc = np.zeros(q_i.shape[:-1] + vg.shape[-1:], dtype=dtype)
        for k_start in tiles.key_tiles(q_start, q_start + q_i.shape[-2]):
            cols = slice(k_start, k_start + tiles.block_k)
            s = tiles.scores(q_i, kg[..., cols, :], q_start, k_start)
            m_new = np.maximum(m_i, tiles.row_max(s))
            shift = np.where(np.isfinite(m_new), m_new, 0)  # a row with nothing visible yet
            s -= shift
            p = tiles.exp(s)
            alpha = np.exp(m_i - shift)  # rescales what was summed under the old max
            l_i = alpha * l_i + tiles.row_sum(p)
            acc *= alpha
            acc += np.matmul(tiles.dropout(p, q_start, k_start), vg[..., cols, :])  # l_i is dropout-free
            m_i = m_new
        np.divide(acc, l_i, out=og[..., rows, :], where=l_i != 0)  # 0: saw nothing; NaN stays NaN
        with np.errstate(divide="ignore"):
            lse_g[..., rows] = (m_i + np.log(l_i, dtype=lse_g.dtype))[..., 0]
        ### END SOLUTION
    return o, lse

