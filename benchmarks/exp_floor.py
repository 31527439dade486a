"""How fast could exp be here? NumPy's float32 exp against a plain AVX2 loop, on one thread.

    python benchmarks/exp_floor.py     # a few seconds; needs a C compiler (cc) for the loops

FlashAttention on NumPy spends what it spends beyond its two products in one exp pass a score
tile (the lab's ``fixed_shift_forward``), so NumPy's exp decides how close a forward comes to torch SDPA
(BENCHMARKS.md, "What limits each figure"). This script times, on a tile-sized float32 array
(131,072 scores in [-10, 0], as a 256 x 512 tile), in ns per element, one thread:

- ``np.exp`` and ``np.exp2`` as this NumPy dispatches them (``numpy.lib.introspect``);
- ``torch.exp``, where torch is installed;
- where ``cc`` builds AVX2 + FMA code and the CPU runs it: a plain AVX2 loop (Cody-Waite range
  reduction, a degree-6 polynomial, the exponent added into the bits: the textbook exp; 0 below
  e^-87, inf above e^88, NaN kept), then the same loop reading and writing each 8 floats through
  ``vmaskmov`` as NumPy's AVX2 exp does. ``blas_swap.py --swap exp`` runs flash with the plain one.

The loops are a floor, not a contender: ag does not ship them. Their largest relative error
against float64 exp is printed beside their time.
"""
from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import timeit

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mlp import cpu_name  # noqa: E402

C_SOURCE = r"""
#include <immintrin.h>
#include <stddef.h>

static inline __m256 exp8(__m256 input) {
    __m256 x = _mm256_min_ps(_mm256_max_ps(input, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.98756915e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.39819995e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.33345191e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.16657959e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.66666655e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.00000012e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    p = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
    /* past the clamps: 0 below e^-87 (-inf included), +inf above e^88, NaN stays NaN */
    p = _mm256_and_ps(p, _mm256_cmp_ps(input, _mm256_set1_ps(-87.0f), _CMP_GE_OQ));
    p = _mm256_blendv_ps(p, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(input, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
    return _mm256_blendv_ps(p, input, _mm256_cmp_ps(input, input, _CMP_UNORD_Q));
}

void exp_plain(const float *x, float *y, size_t n) {
    for (size_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
}

void exp_masked(const float *x, float *y, size_t n) {
    __m256i all = _mm256_set1_epi32(-1);
    for (size_t i = 0; i + 8 <= n; i += 8)
        _mm256_maskstore_ps(y + i, all, exp8(_mm256_maskload_ps(x + i, all)));
}
"""

ELEMENTS = 256 * 512


def build_loops(workdir: str):
    """The two C loops as ctypes functions, or (None, why) where they cannot be built or run here."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if platform.machine() not in ("x86_64", "AMD64"):
        return None, f"not an x86-64 CPU ({platform.machine()})"
    if cc is None:
        return None, "no C compiler (cc) on PATH"
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " avx2" not in flags or " fma" not in flags:
        return None, "this CPU has no AVX2 + FMA"
    src, lib = os.path.join(workdir, "exp_floor.c"), os.path.join(workdir, "exp_floor.so")
    with open(src, "w") as f:
        f.write(C_SOURCE)
    built = subprocess.run([cc, "-O2", "-mavx2", "-mfma", "-shared", "-fPIC", src, "-o", lib],
                           capture_output=True, text=True)
    if built.returncode != 0:
        return None, f"{cc} failed: {built.stderr.strip()[:200]}"
    so = ctypes.CDLL(lib)
    loops = {}
    for name in ("exp_plain", "exp_masked"):
        fn = getattr(so, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        fn.restype = None
        loops[name] = fn
    return loops, ""


def ns_per_element(stmt, repeats: int = 9, number: int = 20) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeats)) / number / ELEMENTS * 1e9


def main() -> None:
    from numpy.lib.introspect import opt_func_info

    x = np.random.default_rng(0).uniform(-10.0, 0.0, ELEMENTS).astype(np.float32)
    y = np.empty_like(x)
    exact = np.exp(x.astype(np.float64))

    def dispatch(name: str) -> str:
        return opt_func_info(func_name=f"^{name}$", signature="float32")[name]["ff"]["current"]

    rows = [(f"np.exp ({dispatch('exp')})", ns_per_element(lambda: np.exp(x, out=y)), np.exp(x)),
            (f"np.exp2 ({dispatch('exp2')})", ns_per_element(lambda: np.exp2(x, out=y)), None)]
    try:
        import torch
        torch.set_num_threads(1)
        tx, ty = torch.from_numpy(x), torch.empty(ELEMENTS, dtype=torch.float32)
        rows.append((f"torch.exp (torch {torch.__version__})", ns_per_element(lambda: torch.exp(tx, out=ty)),
                     torch.exp(tx).numpy()))
    except ImportError:
        rows.append(("torch.exp", float("nan"), None))
    with tempfile.TemporaryDirectory() as workdir:
        loops, why = build_loops(workdir)
        if loops:
            xp, yp = x.ctypes.data, y.ctypes.data
            for name, label in (("exp_plain", "plain AVX2 loop (C)"),
                                ("exp_masked", "the same, loads and stores through vmaskmov")):
                fn = loops[name]
                time_ns = ns_per_element(lambda fn=fn: fn(xp, yp, ELEMENTS))
                fn(xp, yp, ELEMENTS)
                rows.append((label, time_ns, y.copy()))

    print(f"exp over {ELEMENTS:,} float32 in [-10, 0], one thread; numpy {np.__version__}; CPU: {cpu_name()}")
    width = max(len(r[0]) for r in rows)
    base = rows[0][1]
    print(f"{'':{width}}  ns/elem  / np.exp  max rel err")
    for label, time_ns, values in rows:
        err = "" if values is None else f"{np.max(np.abs(values / exact - 1)):.1e}"
        print(f"{label:{width}}  {time_ns:7.3f}  {time_ns / base:7.2f}  {err}")
    if not loops:
        print(f"the C loops: not run ({why})")


if __name__ == "__main__":
    sys.exit(main())
