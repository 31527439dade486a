"""The lab's loops for ``flash_attention``: Algorithm 1 with a fixed shift checked after the fact, and
Algorithm 2 with exp2 where the scores allow. Each gives what the paper's loop gives, to rounding."""
from __future__ import annotations

import numpy as np

from ..attention.forward import tiled_forward
from ..attention.tiles import forward_outputs, group_sum
from .flash_tiles import LabTiles, longest_row


def fixed_shift_forward(tiles: LabTiles, q: np.ndarray, k: np.ndarray, v: np.ndarray,
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
    so the key tiles stop at the first that makes one. A float too
    narrow for the check (float16: tiny · 2^62 is past its max) takes the running max from the start."""
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
        acc = np.zeros(q_i.shape[:-1] + vg.shape[-1:], dtype=dtype)
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


def base2_backward(tiles: LabTiles, q, k, v, o, lse, do, grads=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Algorithm 2 as ``tiled_backward`` computes it, with P_ij = e^(S_ij - L_i) taken as
    2^(log2 e · S_ij - log2 e · L_i) where the tile allows, as FlashAttention's kernels do: NumPy's
    exp2 takes half exp's time where it is SVML's (``Tiles.base2``; elsewhere exp, unchecked). A
    query tile allows it when every visible S_ij - L_i is known to lie in [-80, 0]
    (``Tiles.shift_bounded``); then no P needs the subnormal check either, and a masked tile takes
    exp unchecked. Any other tile is ``tiled_backward``'s (``Tiles.exp_shifted_scores``).

    dK = dSᵀ Q_i with Q_i unscaled, and is multiplied by scale once at the end, as dQ is: the scaled
    query tile (by scale, or by scale · log2 e) is only S_ij's operand, and a tile pair holds one
    such copy whichever exp it takes, so the peak does not depend on the CPU."""
    h = tiles.heads
    qg, kg, vg = tiles.grouped(q, h.group), tiles.grouped(k, 1), tiles.grouped(v, 1)
    dog, og = tiles.grouped(do, h.group), tiles.grouped(o, h.group)
    lse_g = lse.reshape(qg.shape[:-1] + (1,))
    lse_g = np.where(lse_g == -np.inf, np.inf, lse_g)  # a row that saw nothing: P = 0 (NaN stays NaN)
    dq, dk, dv = grads or (np.zeros(q.shape, q.dtype), np.zeros(k.shape, k.dtype), np.zeros(v.shape, v.dtype))
    dqg, dkg, dvg = tiles.grouped(dq, h.group), tiles.grouped(dk, 1), tiles.grouped(dv, 1)
    bounded = tiles.shift_bounded(qg, kg, lse_g)
    d_row = np.sum(dog * og, axis=-1, keepdims=True)
    for k_start in range(0, h.n_k, tiles.block_k):
        cols = slice(k_start, k_start + tiles.block_k)
        k_j, v_j = kg[..., cols, :], vg[..., cols, :]
        for q_start in tiles.query_tiles(k_start):
            rows = slice(q_start, q_start + tiles.block_q)
            q_i, do_i = qg[..., rows, :], dog[..., rows, :]
            p = tiles.exp_shifted_scores(q_i, k_j, lse_g[..., rows, :], q_start, k_start,
                                         bounded[q_start // tiles.block_q])
            dvg[..., cols, :] += group_sum(np.matmul(np.swapaxes(p, -1, -2), do_i))
            ds = np.matmul(do_i, np.swapaxes(v_j, -1, -2))
            ds -= d_row[..., rows, :]
            ds *= p
            dqg[..., rows, :] += np.matmul(ds, k_j)
            dkg[..., cols, :] += group_sum(np.matmul(np.swapaxes(ds, -1, -2), q_i))
    dq *= dq.dtype.type(tiles.scale)
    dk *= dk.dtype.type(tiles.scale)
    return dq, dk, dv
