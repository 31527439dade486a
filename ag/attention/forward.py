"""FlashAttention-2's forward, Algorithm 1, on NumPy: with the paper's running max (exercise 4) and
with a fixed shift checked after the fact (ag's default)."""
from __future__ import annotations

import numpy as np

from .tiles import Tiles, forward_outputs, longest_row


def tiled_forward(tiles: Tiles, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  out=None) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1: for each query tile, stream the key/value tiles through m_i, l_i and acc;
    return O and the row logsumexp L = m_i + log l_i. ``out`` gives (O, L) to fill, zeroed and
    -inf (a worker's views of the whole call's); else they are allocated here."""
    h = tiles.heads
    qg, kg, vg = tiles.grouped(q, h.group), tiles.grouped(k, 1), tiles.grouped(v, 1)
    o, lse = out or forward_outputs(q, k, v)
    og, lse_g = tiles.grouped(o, h.group), tiles.grouped(lse[..., None], h.group)[..., 0]
    dtype = og.dtype
    for q_start in range(0, h.n_q, tiles.block_q):
        rows = slice(q_start, q_start + tiles.block_q)
        q_i = tiles.scaled_queries(qg, rows)
        ### BEGIN SOLUTION
        m_i = np.full(q_i.shape[:-1] + (1,), -np.inf, dtype=dtype)
        l_i = np.zeros_like(m_i)
        acc = np.zeros(q_i.shape, dtype=dtype)
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
            acc += np.matmul(p, vg[..., cols, :])
            m_i = m_new
        np.divide(acc, l_i, out=og[..., rows, :], where=l_i != 0)  # 0: saw nothing; NaN stays NaN
        with np.errstate(divide="ignore"):
            lse_g[..., rows] = (m_i + np.log(l_i))[..., 0]
        ### END SOLUTION
    return o, lse


def fixed_shift_forward(tiles: Tiles, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                        out=None) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1 with a fixed shift of 0 in place of the running max: softmax(S) = e^S / Σ e^S
    for any shift, and m_i is there only to keep e^(S - m_i) in range. While it is, each tile needs
    one pass, P = e^S (``Tiles.exp_scores``: unchecked where the scores are bounded, by exp2 where
    that is NumPy's fast exp), where the running max needs three (max, subtract, exp); l_i and acc
    add up with no rescaling, and L = log l_i. A fixed shift checked after the fact is
    FlashDecoding++'s unified max value (Hong et al., 2023).

    After each query tile, every row's l_i must lie in [tiny · 2^62, max]: then no e^S overflowed,
    and the scores that underflowed (each below tiny) make less than 2^-30 of l_i for N < 2^32, under
    the float's own rounding. Else (a score too large, a row that sees no key or only scores too
    small, a NaN) the tile's rows are redone with the running max (``tiled_forward``), which gives
    0 for a row that sees nothing and carries a NaN. An l_i past max (an overflow, a NaN) stays so,
    so the key tiles stop at the first that makes one: peaked scores (q × 30, N = 2048) wasted four
    key tiles' products a query tile on a redo, now one (BENCHMARKS.md, "History"). A float too
    narrow for the check (float16: tiny · 2^62 is past its max) takes the running max from the start.

    Not an exercise, but it solves exercise 4 another way: a student's copy of ag (``ag assign
    --release``) has ``tiled_forward`` in its place (``Exercise.withheld``)."""
    ### BEGIN SOLUTION
    h = tiles.heads
    qg, kg, vg = tiles.grouped(q, h.group), tiles.grouped(k, 1), tiles.grouped(v, 1)
    o, lse = out or forward_outputs(q, k, v)
    og, lse_g = tiles.grouped(o, h.group), tiles.grouped(lse[..., None], h.group)[..., 0]
    dtype = og.dtype
    info = np.finfo(dtype)
    smallest, longest_key = float(info.tiny) * 2.0 ** 62, longest_row(kg)
    if smallest > float(info.max):  # float16: no row sum could pass the check
        return tiled_forward(tiles, q, k, v, out=(o, lse))
    for q_start in range(0, h.n_q, tiles.block_q):
        rows = slice(q_start, q_start + tiles.block_q)
        q_i = tiles.scaled_queries(qg, rows)
        bounded = tiles.bounded_queries(q_i, longest_key)  # in base 2 if this CPU's exp2 is fast
        l_i = np.zeros(q_i.shape[:-1] + (1,), dtype=dtype)
        acc = np.zeros(q_i.shape, dtype=dtype)
        with np.errstate(over="ignore", invalid="ignore"):  # the check below catches both
            for cols in tiles.key_slices(q_start, q_start + q_i.shape[-2]):
                p = tiles.exp_scores(q_i, bounded, kg[..., cols, :], q_start, cols.start)
                l_i += tiles.row_sum(p)
                if not l_i.max(initial=0) <= info.max:  # an e^S overflowed (or a NaN): the check fails, stop now
                    break
                acc += np.matmul(p, vg[..., cols, :])
        if np.all((l_i >= smallest) & (l_i <= info.max)) and np.isfinite(acc).all():
            np.divide(acc, l_i, out=og[..., rows, :])
            lse_g[..., rows] = np.log(l_i)[..., 0]
        else:
            stop = min(q_start + tiles.block_q, h.n_q)
            tiled_forward(tiles.for_rows(q_start, stop), q[..., rows, :], k, v,
                          out=(o[..., rows, :], lse[..., rows]))
    return o, lse
    ### END SOLUTION
