"""FlashAttention-2's backward, Algorithm 2, on NumPy: every tile of P recomputed from the saved
logsumexp, as the paper writes it (exercise 5)."""
from __future__ import annotations

import numpy as np

from .tiles import Tiles, group_sum


def tiled_backward(tiles: Tiles, q, k, v, o, lse, do, grads=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Algorithm 2: for each key/value tile, recompute P_ij = exp(S_ij - L_i) for every query
    tile; dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - D) with D = rowsum(dO ∘ O), dQ += scale · dS K,
    dK += scale · dSᵀ Q (for GQA, dK and dV summed over the group); scale multiplies dQ and dK once,
    at the end. Dropout (``tiles.dropout``) makes them dV += (P ∘ Z')ᵀ dO and dP = (dO Vᵀ) ∘ Z',
    Z' = Z / (1 - p); softcap multiplies dS by 1 - tanh² (``tiles.softcap_grad``). The grads are
    allocated in the inputs' own shapes, so they can become the inputs' ``.grad`` without a copy; or
    ``grads`` gives zeroed (dq, dk, dv) to add into."""
    h = tiles.heads
    qg, kg, vg = tiles.grouped(q, h.group), tiles.grouped(k, 1), tiles.grouped(v, 1)
    dog, og = tiles.grouped(do, h.group), tiles.grouped(o, h.group)
    lse_g = lse.reshape(qg.shape[:-1] + (1,))
    dq, dk, dv = grads or (np.zeros(q.shape, q.dtype), np.zeros(k.shape, k.dtype), np.zeros(v.shape, v.dtype))
    dqg, dkg, dvg = tiles.grouped(dq, h.group), tiles.grouped(dk, 1), tiles.grouped(dv, 1)
    ### BEGIN SOLUTION
    d_row = tiles.row_dot(dog, og)
    for k_start in range(0, h.n_k, tiles.block_k):
        cols = slice(k_start, k_start + tiles.block_k)
        k_j, v_j = kg[..., cols, :], vg[..., cols, :]
        for q_start in tiles.query_tiles(k_start):
            rows = slice(q_start, q_start + tiles.block_q)
            q_i, do_i = qg[..., rows, :], dog[..., rows, :]
            s = tiles.scores(tiles.scaled_queries(qg, rows), k_j, q_start, k_start)
            lse_i = lse_g[..., rows, :]
            s -= np.where(lse_i == -np.inf, np.inf, lse_i)  # a row that saw nothing: P = 0 (NaN stays NaN)
            p = tiles.exp(s)
            p_kept = tiles.dropout(p, q_start, k_start)  # what the forward multiplied V by
            dvg[..., cols, :] += group_sum(np.matmul(np.swapaxes(p_kept, -1, -2), do_i))
            ds = tiles.dropout(tiles.product(do_i, np.swapaxes(v_j, -1, -2)), q_start, k_start)
            ds -= d_row[..., rows, :]
            ds *= p
            ds[p == 1] = 0  # a row of P that is one-hot: dS is 0 (dP - D is, but for D's rounding)
            tiles.softcap_grad(ds)
            dqg[..., rows, :] += tiles.product(ds, k_j)
            dkg[..., cols, :] += group_sum(np.matmul(np.swapaxes(ds, -1, -2), q_i))
    ### END SOLUTION
    dq *= dq.dtype.type(tiles.scale)  # one pass at the end, not one a tile
    dk *= dk.dtype.type(tiles.scale)
    return dq, dk, dv

