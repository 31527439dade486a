"""Attention: the standard way (S and P materialized) and FlashAttention's tiled way.

Shapes: ``q`` is (..., H, Nq, d); ``k`` and ``v`` are (..., Hkv, Nk, d) with H a multiple
of Hkv: each key/value head serves a group of H / Hkv query heads (GQA; Hkv = 1 is MQA,
Hkv = H is ordinary multi-head attention). ``scale`` defaults to 1/√d.

Causal masking (``causal=True``) is top-left aligned, as in
``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``: query i sees keys
0..i. ``causal="bottom_right"`` is FlashAttention-2's alignment: query i sees keys
0..i + Nk - Nq, so when Nq > Nk the first rows see nothing; such a fully masked row
gives output 0 and zero gradients, never NaN.

The tiled path follows FlashAttention-2 (Dao, 2023), Algorithm 1 and 2: query tiles
outside, key/value tiles inside, a running max ``m_i`` and sum ``l_i``, an unscaled
accumulator ``acc`` divided once at the end, and only O and the logsumexp ``lse`` saved
for backward, which recomputes every tile of P from ``lse`` with D = rowsum(dO ∘ O).

One concept a module:

- ``shapes``: the checks, the causal mask and the scale every path shares;
- ``dropout``: Philox4x32-10 in NumPy and ``keep_mask``, dropout's mask as a pure function of a seed;
- ``variants``: FlashAttention's ``window_size``, ``softcap``, ``alibi_slopes`` and ``dropout_p``, by (row, col);
- ``naive``: ``naive_attention``, S and P in memory, autograd through the engine, every variant's reference;
- ``online``: the online softmax's block merge (exercise 3);
- ``tiles``: one tiled call's tiles and the arithmetic both loops share (``Tiles``);
- ``forward``: Algorithm 1, ``tiled_forward`` (exercise 4);
- ``backward``: Algorithm 2, ``tiled_backward`` (exercise 5);
- ``flash``: ``flash_attention``, the loops as one op, on NumPy (the seam ``flash_passes``, where
  the opt-in lab, ``ag.lab``, puts its own loops and threads) or on the GPU;
- ``decode``: ``flash_decode``, one query against a KV cache split over keys (FlashDecoding; its
  batch entries through the seam ``decode_entries``);
- ``varlen``: ``flash_attn_varlen``, packed batches of sequences by ``cu_seqlens``;
- ``gpu``: the CUDA kernels (``kernels/*.cu``) through CuPy, imported lazily.
"""
from .backward import tiled_backward
from .decode import flash_decode
from .dropout import keep_mask
from .flash import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, flash_attention
from .forward import tiled_forward
from .naive import naive_attention
from .online import SoftmaxBlock, merge_softmax_blocks, online_softmax, softmax_block
from .tiles import Tiles
from .varlen import flash_attn_varlen

__all__ = [
    "DEFAULT_BLOCK_K", "DEFAULT_BLOCK_Q", "SoftmaxBlock", "Tiles", "flash_attention", "flash_attn_varlen",
    "flash_decode", "keep_mask", "merge_softmax_blocks", "naive_attention", "online_softmax", "softmax_block", "tiled_backward", "tiled_forward",
]
