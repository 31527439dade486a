"""``flash_attention``: the tiled forward and backward as one op, on NumPy or on the GPU (CuPy and
the CUDA kernels)."""
from __future__ import annotations

import contextlib
import functools

import numpy as np

from ..arrays import array_module
from ..ops.kernels import KERNELS, classroom
from ..tensor import Grads, Saved, Tensor, make_output
from .backward import tiled_backward
from .forward import tiled_forward
from .naive import check_value_shape
from .shapes import Heads, check_block, check_causal, softmax_scale
from .tiles import Tiles, statistics_dtype
from .variants import UNBOUNDED, Variants, variants

DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 256
# backward sums Pᵀ dO and dSᵀ Q over a query tile's rows in one product: 64 rows keep a float32 sum
# short (FlashAttention-2's backward kernels take 64 or 128 query rows a tile too)
DEFAULT_BLOCK_Q_BACKWARD = 64


def flash_attention(q, k, v, *, causal=False, scale=None, block_q: int | None = None,
                    block_k: int | None = None, return_lse: bool = False, backend: str = "numpy",
                    window_size=(UNBOUNDED, UNBOUNDED), alibi_slopes=None, softcap: float = 0.0,
                    dropout_p: float = 0.0, seed: int | None = None):
    """O = softmax(scale · Q Kᵀ + mask + bias) V, tile by tile (FlashAttention-2): no N×N array is held.

    Arrays in, arrays out; Tensors in, a Tensor out whose backward recomputes P tile by tile from
    the saved logsumexp (for GQA, k's and v's grads summed over each group). ``return_lse=True``
    also returns L = logsumexp of each row of scaled scores, (..., H, Nq). On NumPy the tiles are
    ``block_q`` × ``block_k`` (None: 256, and 64 query rows in backward), the loops ``tiled_forward``
    and ``tiled_backward``; float16 and bfloat16 inputs keep their statistics and accumulators in
    float32 (L stays float32); float32 inputs get L in float64 on the classroom path (``Tiles.lse_dtype``).
    ``window_size``, ``alibi_slopes``, ``softcap`` and ``dropout_p`` with a ``seed`` are FlashAttention's
    (``ag.attention.variants``; NumPy only; dropout's mask is redrawn from the seed in backward, never
    stored), and v may have its own head dim dv (O is then (..., H, Nq, dv)).
    """
    check_causal("flash_attention", causal)
    extra = dict(window_size=window_size, alibi_slopes=alibi_slopes, softcap=softcap, dropout_p=dropout_p, seed=seed)
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if size is not None:
            check_block("flash_attention", name, size)
    tensors = any(isinstance(x, Tensor) for x in (q, k, v))
    values = [x.value if isinstance(x, Tensor) else x if hasattr(x, "shape") else np.asarray(x) for x in (q, k, v)]
    if _backend(backend, values[0]) == "cupy":
        forward, backward = _cupy_passes(causal, scale, extra)
    else:
        forward, backward = _numpy_passes(*values, causal, scale, block_q, block_k, extra)
    o, lse = forward(*values)
    if not tensors:
        return (o, lse) if return_lse else o
    tq, tk, tv = (x if isinstance(x, Tensor) else Tensor(x) for x in (q, k, v))

    def _backward(out: Tensor, saved: Saved) -> Grads:
        return backward(saved[tq], saved[tk], saved[tv], saved[out], lse, out.grad)
    rerun = functools.partial(flash_attention, causal=causal, scale=scale, block_q=block_q, block_k=block_k,
                              backend=backend, **extra)
    out = make_output(o, "flash_attention", (tq, tk, tv), _backward, saves=(tq, tk, tv), saves_output=True,
                      call=(rerun, tq, tk, tv))
    return (out, lse) if return_lse else out


@classroom("flash_passes")
def tiled_passes(heads: Heads, causal, scale: float, block_q: int | None, block_k: int | None,
                 variants: Variants | None = None):
    """The paper's loops, ``tiled_forward`` and ``tiled_backward``, on one thread, BLAS held to one
    thread: a tile's many small products stall on a multi-threaded BLAS when a core is busy."""
    tiles, backward_tiles = classroom_tiles(heads, causal, scale, block_q, block_k, variants)

    def forward(q, k, v):
        with one_blas_thread():
            o, lse = tiled_forward(tiles, q, k, v)
        tiles.free_buffers()
        tiles.count_products(2)  # S = QKᵀ, PV
        return o, lse

    def backward(q, k, v, o, lse, do):
        with one_blas_thread():
            grads = tiled_backward(backward_tiles, q, k, v, o, lse, do)
        backward_tiles.free_buffers()
        backward_tiles.count_products(5)  # S again, PᵀdO, dO Vᵀ, dS K, dSᵀ Q
        return grads
    return forward, backward


def classroom_tiles(heads: Heads, causal, scale: float, block_q: int | None, block_k: int | None,
                    variants: Variants | None = None) -> tuple[Tiles, Tiles]:
    """The forward's and the backward's tiles: ``block_q`` × ``block_k``, None taking the defaults
    (256 × 256; 64 query rows in backward)."""
    return (Tiles(heads, causal, scale, block_q or DEFAULT_BLOCK_Q, block_k or DEFAULT_BLOCK_K, variants=variants),
            Tiles(heads, causal, scale, block_q or DEFAULT_BLOCK_Q_BACKWARD, block_k or DEFAULT_BLOCK_K,
                  variants=variants))


def plain(extra: dict) -> bool:
    """Are ``extra``'s variants (``flash_attention``'s keywords) all off?"""
    return (tuple(extra["window_size"]) == (UNBOUNDED, UNBOUNDED) and extra["alibi_slopes"] is None
            and not extra["softcap"] and not extra["dropout_p"])


def _numpy_passes(q, k, v, causal, scale, block_q: int | None, block_k: int | None, extra: dict):
    """The passes in the seam ``flash_passes`` (``tiled_passes``, or the lab's), run on the inputs
    in their statistics dtype (``statistics_dtype``), the outputs and grads cast back (a narrow
    float's L to float32, as FlashAttention keeps it). ``extra``:
    the variants' keywords, as ``variants`` takes them."""
    if any(array_module(x) is not np for x in (q, k, v)):
        raise TypeError(f"flash_attention: backend='numpy' needs NumPy arrays, got "
                        f"{', '.join(sorted({type(x).__module__ for x in (q, k, v)}))} arrays; use "
                        "backend='cupy' (or 'auto') for GPU arrays")
    heads = check_value_shape("flash_attention", q, k, v)
    extras = variants("flash_attention", heads, causal, **extra)
    forward, backward = KERNELS.flash_passes(heads, causal, softmax_scale(scale, heads.d), block_q, block_k,
                                             None if plain(extra) else extras)
    wide = statistics_dtype(np.result_type(q, k, v))

    def wide_forward(q, k, v):
        o, lse = forward(*(x.astype(wide, copy=False) for x in (q, k, v)))
        dtype = np.result_type(q, k, v)
        return o.astype(dtype, copy=False), lse if wide == dtype else lse.astype(wide)

    def wide_backward(q, k, v, o, lse, do):
        grads = backward(*(x.astype(wide, copy=False) for x in (q, k, v, o)), lse, do.astype(wide, copy=False))
        return tuple(g.astype(x.dtype, copy=False) for g, x in zip(grads, (q, k, v)))
    return wide_forward, wide_backward


@functools.cache
def _blas_controller():
    """threadpoolctl's view of the BLAS libraries loaded (None without threadpoolctl), made once."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def one_blas_thread():
    """A context in which BLAS runs on one thread (threadpoolctl, ``pip install 'ag[fast]'``; else as it is)."""
    blas = _blas_controller()
    return contextlib.nullcontext() if blas is None else blas.limit(limits=1, user_api="blas")


def _cupy_passes(causal, scale, extra: dict):
    """The same passes on the GPU: ``kernels/flash_fwd.cu`` and ``flash_bwd.cu`` through CuPy
    (``gpu``), float32, one thread block per (batch·head, query tile), no atomics in backward; no
    variant (``extra``, refused rather than ignored)."""
    if not plain(extra):
        raise ValueError(f"flash_attention(backend='cupy'): the CUDA kernels take no window_size, alibi_slopes, "
                         f"softcap or dropout_p (got {tuple(extra['window_size'])}, {extra['alibi_slopes']!r}, "
                         f"{extra['softcap']}, {extra['dropout_p']}); NumPy arrays take them all")
    from . import gpu
    ready, reason = gpu.available()
    if not ready:
        raise RuntimeError(f"flash_attention(backend='cupy'): {reason}")

    def forward(q, k, v):
        return gpu.forward(q, k, v, causal=causal, scale=scale)

    def backward(q, k, v, o, lse, do):
        return gpu.backward(q, k, v, o, lse, do, causal=causal, scale=scale)
    return forward, backward


def _backend(backend: str, q) -> str:
    if backend == "auto":
        return "cupy" if type(q).__module__.startswith("cupy") else "numpy"
    if backend not in ("numpy", "cupy"):
        raise ValueError(f"flash_attention: backend must be 'numpy', 'cupy' or 'auto', got {backend!r}")
    return backend
