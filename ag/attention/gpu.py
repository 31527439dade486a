"""FlashAttention-2 on the GPU: the CUDA kernels in ``kernels/`` beside this file, loaded with
``cupy.RawModule``.

The CUDA twin of ``ag.attention.tiled_forward`` and ``tiled_backward``, with the same names
(``m_i``, ``l_i``, ``acc``, ``lse``, ``D``) so that one reads next to the other:

- ``flash_fwd.cu``: the float32 forward, O and the row logsumexp lse;
- ``flash_bwd.cu``: the float32 backward, D = rowsum(dO ∘ O), then a dK/dV pass and a dQ pass
  (no atomics, so the gradients are the same bits on every run);
- ``flash_fwd_bf16.cu``: the forward in bfloat16 on the tensor cores (``mma.sync`` m16n8k16,
  float32 accumulation, K and V tiles copied by ``cp.async`` in two stages), float32 O and lse;
- ``flash_bwd_bf16.cu``: the backward in bfloat16 on the tensor cores, the same two passes as
  ``flash_bwd.cu``, float32 gradients. The two bf16 sources share ``bf16_mma.cuh``, which
  ``kernel_code`` pastes in before NVRTC sees them (so CuPy's disk cache, keyed on the code, sees
  a change to it).

Shapes as in ``ag.attention``: q (..., H, Nq, d), k and v (..., Hkv, Nk, d), H a multiple of Hkv,
here with 1 <= d <= 128. ``causal`` is False, True / "top_left" or "bottom_right"; ``scale``
defaults to 1/√d. Every kernel is compiled by NVRTC on first use, once per (source, d), and
CuPy keeps the binary on disk. Outputs may be given with ``out=``, arrays the kernels write
every element of (the GPU tests fill them with NaN first).

CuPy is imported inside the functions: ``import ag.attention.gpu`` works without it, and
``available()`` says why the GPU path cannot run.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..ops import ShapeError

KERNEL_DIR = Path(__file__).with_name("kernels")
KERNELS = {  # source file (without .cu) -> its extern "C" entry points
    "flash_fwd": ("flash_fwd_f32",),
    "flash_bwd": ("flash_bwd_preprocess_f32", "flash_bwd_dkdv_f32", "flash_bwd_dq_f32"),
    "flash_fwd_bf16": ("flash_fwd_bf16",),
    "flash_bwd_bf16": ("flash_bwd_dkdv_bf16", "flash_bwd_dq_bf16"),
}
MAX_HEAD_DIM = 128
BLOCK = 64  # query rows per block and keys per tile, in every kernel
THREADS = {"flash_fwd_f32": 128, "flash_bwd_preprocess_f32": 256, "flash_bwd_dkdv_f32": 256,
           "flash_bwd_dq_f32": 256, "flash_fwd_bf16": 128, "flash_bwd_dkdv_bf16": 128, "flash_bwd_dq_bf16": 128}
DYNAMIC_SMEM = set(THREADS) - {"flash_bwd_preprocess_f32"}  # the kernels whose source has a <name>_smem constant
_INCLUDE = re.compile(r'^#include "([\w.]+)"$', re.MULTILINE)
MAX_GRID_Y = 65535
_CAUSAL_MODES = {False: 0, True: 1, "top_left": 1, "bottom_right": 2}
_OP = "flash_attention(backend='cupy')"


def kernel_sources() -> dict[str, Path]:
    """The CUDA sources, by name: flash_fwd, flash_bwd, flash_fwd_bf16, flash_bwd_bf16."""
    return {name: KERNEL_DIR / f"{name}.cu" for name in KERNELS}


def kernel_code(source: str) -> str:
    """The code NVRTC compiles for a source: its text with each ``#include "x.cuh"`` replaced by
    kernels/x.cuh (NVRTC is given no include path)."""
    code = kernel_sources()[source].read_text()
    return _INCLUDE.sub(lambda m: (KERNEL_DIR / m[1]).read_text(), code)


def available() -> tuple[bool, str]:
    """(True, the device) when the kernels can run here; (False, why not) otherwise."""
    try:
        import cupy
    except Exception as error:  # ImportError, or a CuPy that cannot load its CUDA libraries
        return False, f"CuPy is not importable ({type(error).__name__}: {error}); pip install 'ag[gpu]'"
    try:
        if not cupy.cuda.is_available():
            return False, "cupy.cuda.is_available() is False: no CUDA GPU or driver on this machine"
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    except Exception as error:
        return False, f"CuPy cannot reach a GPU ({type(error).__name__}: {error})"
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return True, f"CuPy {cupy.__version__} on {name} (sm_{props['major']}{props['minor']})"


# ---- bfloat16 as bits ----

def to_bfloat16(x):
    """The bits of the bfloat16 nearest to each float32 (ties to even), as uint16; NumPy or CuPy in, same out."""
    bits = x.astype(np.float32, order="C").view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def from_bfloat16(bits):
    """float32 values of bfloat16 bits (uint16): the bits become the top half of a float32."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---- one call, checked ----

@dataclass(frozen=True)
class _Launch:
    """One attention call's shapes, mask and scale, checked, and the grids and arguments they give."""

    batch: int  # the product of the leading dimensions
    h: int
    h_kv: int
    n_q: int
    n_k: int
    d: int
    causal: int
    scale: float

    def args(self) -> tuple:
        return (np.int32(self.n_q), np.int32(self.n_k), np.int32(self.h), np.int32(self.h_kv),
                np.float32(self.scale), np.int32(self.causal))

    def query_grid(self) -> tuple[int, int]:
        """One block per (batch·head, query tile)."""
        return (-(-self.n_q // BLOCK), self.batch * self.h)

    def key_grid(self) -> tuple[int, int]:
        """One block per (batch·kv head, key tile)."""
        return (-(-self.n_k // BLOCK), self.batch * self.h_kv)


def _plan(q, k, v, causal, scale, dtypes: tuple[str, ...]) -> _Launch:
    """Check one call's arguments (anything with .shape and .dtype) and return its launch."""
    if causal not in (False, True, "top_left", "bottom_right"):
        raise ValueError(f"{_OP}: causal must be False, True ('top_left') or 'bottom_right', got {causal!r}")
    got = [np.dtype(x.dtype).name for x in (q, k, v)]
    if len(set(got)) != 1 or got[0] not in dtypes:
        raise TypeError(f"{_OP}: this kernel needs q, k and v all {' or all '.join(dtypes)}, got {', '.join(got)}"
                        + (" (cast with .astype(cupy.float32))" if dtypes == ("float32",) else ""))
    shapes = [tuple(x.shape) for x in (q, k, v)]
    if any(len(s) < 3 for s in shapes) or not len(shapes[0]) == len(shapes[1]) == len(shapes[2]):
        raise ShapeError(f"{_OP}: q, k and v need the same rank, at least 3 (..., heads, tokens, head_dim), "
                         f"got shapes {shapes[0]}, {shapes[1]} and {shapes[2]}")
    if shapes[1] != shapes[2] or shapes[0][:-3] != shapes[1][:-3] or shapes[0][-1] != shapes[1][-1]:
        raise ShapeError(f"{_OP}: k and v must have one shape, and q the same leading dimensions and head dim, "
                         f"got shapes {shapes[0]}, {shapes[1]} and {shapes[2]}")
    *lead, h, n_q, d = shapes[0]
    h_kv, n_k = shapes[1][-3], shapes[1][-2]
    if h_kv == 0 or h % h_kv:
        raise ShapeError(f"{_OP}: {h} query heads are not a multiple of {h_kv} key/value heads "
                         f"(shapes {shapes[0]} and {shapes[1]})")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{_OP}: the kernels take head dims 1..{MAX_HEAD_DIM}, got d = {d} (q shape {shapes[0]})")
    batch = math.prod(lead)
    if batch * h > MAX_GRID_Y:
        raise ValueError(f"{_OP}: {batch * h} (batch × heads) blocks of queries are more than a grid's "
                         f"{MAX_GRID_Y} (q shape {shapes[0]})")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return _Launch(batch, h, h_kv, n_q, n_k, d, _CAUSAL_MODES[causal], scale)


def _cupy_arrays(*arrays):
    """The arrays as C-contiguous, 16-byte-aligned CuPy arrays (the kernels' vector loads need both)."""
    if not all(type(x).__module__.split(".")[0] == "cupy" for x in arrays):
        names = ", ".join(f"{type(x).__module__}.{type(x).__name__}" for x in arrays)
        raise TypeError(f"{_OP}: the CUDA kernels need CuPy arrays, got {names}")
    import cupy
    arrays = [cupy.ascontiguousarray(x) for x in arrays]
    return [x if x.data.ptr % 16 == 0 else x.copy() for x in arrays]


def _outputs(out, wanted: dict[str, tuple[tuple[int, ...], str]]) -> list:
    """``out`` checked against {name: (shape, dtype)}, or new arrays."""
    import cupy
    if out is None:
        return [cupy.empty(shape, dtype) for shape, dtype in wanted.values()]
    if len(out) != len(wanted):
        raise ValueError(f"{_OP}: out must be {len(wanted)} arrays ({', '.join(wanted)}), got {len(out)}")
    for x, (name, (shape, dtype)) in zip(out, wanted.items()):
        if not (isinstance(x, cupy.ndarray) and x.shape == shape and x.dtype == dtype and x.flags.c_contiguous):
            raise ValueError(f"{_OP}: out array {name} must be a C-contiguous {dtype} CuPy array of shape {shape}, "
                             f"got {type(x).__name__} {getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}")
    return list(out)


# ---- the kernels ----

@functools.lru_cache(maxsize=None)
def _module(source: str, head_dim: int):
    import cupy
    return cupy.RawModule(code=kernel_code(source), options=("-std=c++17", f"-DHEAD_DIM={head_dim}"))


@functools.lru_cache(maxsize=None)
def _kernel(source: str, name: str, head_dim: int, device: int):
    """The compiled kernel and its dynamic shared memory in bytes (the ``<name>_smem`` constant in its source)."""
    import cupy
    module = _module(source, head_dim)
    kernel = module.get_function(name)
    smem = 0
    if name in DYNAMIC_SMEM:
        pointer = module.get_global(f"{name}_smem")
        smem = int(cupy.ndarray((), cupy.int32, pointer).get())
        kernel.max_dynamic_shared_size_bytes = smem
    return kernel, smem


def _launch(source: str, name: str, head_dim: int, grid: tuple[int, ...], args: tuple) -> None:
    import cupy
    if 0 in grid:
        return
    kernel, smem = _kernel(source, name, head_dim, cupy.cuda.Device().id)
    kernel(grid, (THREADS[name],), args, shared_mem=smem)


def forward(q, k, v, *, causal=False, scale=None, out=None):
    """(o, lse) with o = softmax(scale · q kᵀ + mask) v and lse = logsumexp of each row of scaled scores,
    by flash_fwd.cu in float32: o shaped like q, lse (..., H, Nq); ``out=(o, lse)`` writes into given arrays."""
    launch = _plan(q, k, v, causal, scale, ("float32",))
    q, k, v = _cupy_arrays(q, k, v)
    o, lse = _outputs(out, {"o": (q.shape, "float32"), "lse": (q.shape[:-1], "float32")})
    _launch("flash_fwd", "flash_fwd_f32", launch.d, launch.query_grid(), (q, k, v, o, lse) + launch.args())
    return o, lse


def _check_backward_inputs(q, o, lse, do, do_dtypes: tuple[str, ...]) -> None:
    for name, x, shape, dtypes in (("o", o, q.shape, ("float32",)), ("do", do, q.shape, do_dtypes),
                                   ("lse", lse, q.shape[:-1], ("float32",))):
        if tuple(x.shape) != tuple(shape) or np.dtype(x.dtype).name not in dtypes:
            raise ShapeError(f"{_OP}: backward needs {name} of shape {tuple(shape)}, {' or '.join(dtypes)}, got "
                             f"{tuple(x.shape)}, {np.dtype(x.dtype).name}")


def _row_dots(launch: _Launch, o, do):
    """D = rowsum(do ∘ o), float32, one per query row (flash_bwd.cu's preprocess kernel)."""
    import cupy
    D = cupy.empty(o.shape[:-1], cupy.float32)
    rows = launch.batch * launch.h * launch.n_q
    warps = THREADS["flash_bwd_preprocess_f32"] // 32
    _launch("flash_bwd", "flash_bwd_preprocess_f32", launch.d, (-(-rows // warps),), (o, do, D, np.int64(rows)))
    return D


def backward(q, k, v, o, lse, do, *, causal=False, scale=None, out=None):
    """(dq, dk, dv) of a loss whose grad at o = forward(q, k, v) is ``do``, by flash_bwd.cu in float32:
    D = rowsum(do ∘ o), then dK, dV (summed over each GQA group, shaped like k, v) and dQ, each element
    written by one thread, no atomics; ``out=(dq, dk, dv)`` writes into given arrays."""
    launch = _plan(q, k, v, causal, scale, ("float32",))
    _check_backward_inputs(q, o, lse, do, ("float32",))
    q, k, v, o, lse, do = _cupy_arrays(q, k, v, o, lse, do)
    dq, dk, dv = _outputs(out, {"dq": (q.shape, "float32"), "dk": (k.shape, "float32"),
                                "dv": (v.shape, "float32")})
    D = _row_dots(launch, o, do)
    _launch("flash_bwd", "flash_bwd_dkdv_f32", launch.d, launch.key_grid(),
            (q, k, v, do, lse, D, dk, dv) + launch.args())
    _launch("flash_bwd", "flash_bwd_dq_f32", launch.d, launch.query_grid(), (q, k, v, do, lse, D, dq) + launch.args())
    return dq, dk, dv


def _bfloat16_bits(*arrays):
    """The arrays as bfloat16 bits on a GPU with bf16 mma: uint16 arrays as they are, float32 rounded."""
    import cupy
    capability = cupy.cuda.Device().compute_capability
    if int(capability) < 80:
        raise RuntimeError(f"{_OP}: the bfloat16 kernels need tensor cores with bf16 mma (sm_80 or newer), "
                           f"this GPU is sm_{capability}")
    return _cupy_arrays(*(x if x.dtype == np.uint16 else to_bfloat16(x) for x in arrays))


def forward_bf16(q, k, v, *, causal=False, scale=None, out=None):
    """forward() in bfloat16 on the tensor cores, by flash_fwd_bf16.cu: q, k, v as float32 (rounded to the
    nearest bfloat16 here) or as uint16 bfloat16 bits (``to_bfloat16``); o and lse float32."""
    launch = _plan(q, k, v, causal, scale, ("float32", "uint16"))
    q, k, v = _bfloat16_bits(q, k, v)
    o, lse = _outputs(out, {"o": (q.shape, "float32"), "lse": (q.shape[:-1], "float32")})
    _launch("flash_fwd_bf16", "flash_fwd_bf16", launch.d, launch.query_grid(), (q, k, v, o, lse) + launch.args())
    return o, lse


def backward_bf16(q, k, v, o, lse, do, *, causal=False, scale=None, out=None):
    """backward() in bfloat16 on the tensor cores, by flash_bwd_bf16.cu: q, k, v and do as float32 (rounded
    to the nearest bfloat16 here) or as bfloat16 bits, o and lse float32 from forward_bf16; D = rowsum(do ∘ o)
    from the rounded do, the five products in bf16 with float32 accumulation (P and dS rounded to bf16 on
    their way back into the tensor cores); dq, dk, dv float32, the same bits on every run."""
    launch = _plan(q, k, v, causal, scale, ("float32", "uint16"))
    _check_backward_inputs(q, o, lse, do, ("float32", "uint16"))
    q, k, v, do = _bfloat16_bits(q, k, v, do)
    o, lse = _cupy_arrays(o, lse)
    dq, dk, dv = _outputs(out, {"dq": (q.shape, "float32"), "dk": (k.shape, "float32"),
                                "dv": (v.shape, "float32")})
    D = _row_dots(launch, o, from_bfloat16(do))
    _launch("flash_bwd_bf16", "flash_bwd_dkdv_bf16", launch.d, launch.key_grid(),
            (q, k, v, do, lse, D, dk, dv) + launch.args())
    _launch("flash_bwd_bf16", "flash_bwd_dq_bf16", launch.d, launch.query_grid(),
            (q, k, v, do, lse, D, dq) + launch.args())
    return dq, dk, dv
