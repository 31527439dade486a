"""Packed batches of sequences of different lengths, FlashAttention's ``cu_seqlens``: no padding is
stored or computed, and no query attends to another sequence's keys."""
from __future__ import annotations

import numpy as np

from ..ops import ShapeError, concat, getitem
from ..tensor import Tensor
from .dropout import check_seed
from .flash import flash_attention
from .naive import naive_attention

ATTENTIONS = {"flash": flash_attention, "naive": naive_attention}
# dropout: each sequence's call numbers its heads from 0, so each takes a seed (a Philox key) of its own
SEED_STEP = 0x9E3779B97F4A7C15


def flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, attention: str = "flash", alibi_slopes=None,
                      seed: int | None = None, **options):
    """Sequence i is q[:, cu_seqlens_q[i]:cu_seqlens_q[i+1]] against k and v[:, cu_seqlens_k[i]:
    cu_seqlens_k[i+1]], each run through ``attention`` ("flash": ``flash_attention``, "naive") alone,
    and the outputs packed again as q is.

    q is (H, total_q, d) and k, v are (Hkv, total_k, d): ag's layout, tokens second to last, with
    the batch packed along them. ``cu_seqlens_*``: the B + 1 cumulative lengths, from 0 to total.
    ``alibi_slopes`` (H,) or (B, H): sequence i takes its row. Other ``options`` (causal, scale,
    window_size, ...) go to ``attention`` as they are, but ``seed``: with ``dropout_p``, sequence i
    draws its mask from ``sequence_seed(seed, i)``. Tensors in, a Tensor out (autograd through each
    call and the slices).
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"flash_attn_varlen: attention must be 'flash' or 'naive', got {attention!r}")
    tensors = any(isinstance(x, Tensor) for x in (q, k, v))
    q, k, v = (x if isinstance(x, Tensor) else Tensor(x) for x in (q, k, v))
    starts_q, starts_k = check_cu_seqlens(q, k, v, cu_seqlens_q, cu_seqlens_k)
    outputs = []
    for i in range(len(starts_q) - 1):
        rows, cols = slice(starts_q[i], starts_q[i + 1]), slice(starts_k[i], starts_k[i + 1])
        if alibi_slopes is not None:
            options["alibi_slopes"] = np.asarray(alibi_slopes)[i] if np.ndim(alibi_slopes) == 2 else alibi_slopes
        if options.get("dropout_p"):
            options["seed"] = sequence_seed(seed, i)
        outputs.append(ATTENTIONS[attention](getitem(q, (slice(None), rows)), getitem(k, (slice(None), cols)),
                                             getitem(v, (slice(None), cols)), **options))
    o = concat(outputs, axis=-2)
    return o if tensors else o.value


def sequence_seed(seed: int | None, i: int) -> int | None:
    """The dropout seed of packed sequence i: seed + i · ``SEED_STEP`` (mod 2^64); None stays None."""
    return None if seed is None else (check_seed(seed) + i * SEED_STEP) % 2 ** 64


def check_cu_seqlens(q, k, v, cu_seqlens_q, cu_seqlens_k) -> tuple[list[int], list[int]]:
    """The cumulative lengths as lists, checked against q's and k's token counts."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ShapeError(f"flash_attn_varlen: q, k and v must be packed as (heads, total_tokens, head_dim), "
                         f"got shapes {q.shape}, {k.shape} and {v.shape}")
    starts = []
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, q.shape[1]), ("cu_seqlens_k", cu_seqlens_k, k.shape[1])):
        cu = np.asarray(cu)
        if (cu.ndim != 1 or cu.size < 2 or cu.dtype.kind not in "iu" or cu[0] != 0 or cu[-1] != total
                or (np.diff(cu) < 0).any()):
            raise ValueError(f"flash_attn_varlen: {name} must rise from 0 to the {total} packed tokens, "
                             f"one entry more than sequences, got {cu.tolist() if cu.ndim == 1 else cu!r}")
        starts.append([int(c) for c in cu])
    if len(starts[0]) != len(starts[1]):
        raise ValueError(f"flash_attn_varlen: cu_seqlens_q has {len(starts[0]) - 1} sequences and "
                         f"cu_seqlens_k {len(starts[1]) - 1}; they must agree")
    return starts[0], starts[1]
