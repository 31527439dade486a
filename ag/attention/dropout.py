"""Dropout inside attention without an N×N mask: a counter-based random number generator.

FlashAttention stores a seed, not a mask. Its forward draws each kept-or-dropped bit of P from a
counter-based generator, Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
3", SC 2011; cuRAND's and FlashAttention's generator), and its backward draws the same bits again.
A counter-based generator is a pure function bits = philox(counter, key): element (bh, row, col) of
the mask depends on nothing but its own counter and the seed, so any tiling, any thread count and
any order of tiles gives the same mask, and the mask costs no memory between forward and backward.
"""
from __future__ import annotations

import numpy as np

# Philox4x32's round constants: two multipliers and the Weyl increments of the key (Random123).
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
PHILOX_ROUNDS = 10
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def philox4x32(counter, key, rounds: int = PHILOX_ROUNDS) -> tuple[np.ndarray, ...]:
    """Philox4x32-``rounds``: four 32-bit words in, four out, for a 64-bit key (k0, k1).

    A round: (hi0, lo0) = M0 · c0, (hi1, lo1) = M1 · c2 (64-bit products cut in halves);
    c ← (hi1 ⊕ c1 ⊕ k0, lo1, hi0 ⊕ c3 ⊕ k1, lo0); then the key steps, k ← k + W (mod 2^32).
    ``counter`` is four integer arrays (broadcast together), ``key`` two integers or arrays;
    returns four uint32 arrays.
    """
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & _LOW for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) & _LOW for k in key)
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + np.uint64(PHILOX_W[0])) & _LOW, (k1 + np.uint64(PHILOX_W[1])) & _LOW
        p0, p1 = m0 * c0, m1 * c2  # exact: both factors are below 2^32
        c0, c1, c2, c3 = (p1 >> _32) ^ c1 ^ k0, p1 & _LOW, (p0 >> _32) ^ c3 ^ k1, p0 & _LOW
    return tuple(np.asarray(c, dtype=np.uint32) for c in (c0, c1, c2, c3))


def keep_threshold(p: float) -> int:
    """An element is kept where its 32-bit draw is at least round(p · 2^32) (``ag.dropout``'s rule)."""
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {p!r}")
    return min(round(float(p) * 2.0 ** 32), 2 ** 32 - 1)


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 64:
        raise ValueError(f"dropout seed must be an integer in [0, 2^64), got {seed!r}")
    return int(seed)


def keep_mask(seed: int, bh, rows, cols, p: float) -> np.ndarray:
    """Which entries of P dropout keeps: a bool array of shape bh.shape + (len(rows), len(cols)).

    Entry (b, i, j) is word j mod 4 of philox4x32(counter = (j // 4, i, b mod 2^32, b // 2^32),
    key = (seed mod 2^32, seed // 2^32)), kept where it is at least round(p · 2^32): a pure function
    of (seed, bh, row, col). ``bh`` numbers the (batch, head) pair, b · H + h, and broadcasts as
    the leading dimensions (an integer gives none); ``rows`` and ``cols`` are absolute indices.
    """
    threshold, seed = keep_threshold(p), check_seed(seed)
    bh = np.asarray(bh, dtype=np.uint64)[..., None, None]
    rows = np.asarray(rows, dtype=np.uint64).reshape(-1)[:, None]
    cols = np.asarray(cols, dtype=np.int64).reshape(-1)
    blocks, which = np.unique(cols // 4, return_inverse=True)  # one Philox call serves four columns
    words = philox4x32((blocks.astype(np.uint64), rows, bh & _LOW, bh >> _32),
                       (seed & 0xFFFFFFFF, seed >> 32))
    draws = np.stack(np.broadcast_arrays(*words), axis=-1)  # (..., rows, blocks, 4)
    return draws[..., which.reshape(-1), cols % 4] >= np.uint32(threshold)


def dropout_scale(p: float) -> float:
    """What a kept entry of P is multiplied by, 1 / (1 - p), so that E[dropout(P)] = P."""
    return 1.0 / (1.0 - float(p))
