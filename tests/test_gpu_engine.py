"""ag's engine on real CuPy arrays on a GPU, against the same computation on NumPy.

tests/test_device_agnostic.py runs the models (the MLP step, naive attention with GQA,
``nn.TransformerLayer`` in all three recomputation modes, a rematerialized chain) on a CuPy
stand-in in CI and on CuPy where a GPU is. This file checks what only a GPU has: flash attention
through the CUDA kernels in the engine's graph, ``start_trace(device="gpu")`` against CuPy's memory
pool, and the demo's and lecture 4.9's table. Skipped, with the reason, where CuPy or a GPU is missing.
"""
import numpy as np
import pytest

import ag
from ag.attention import flash_attention, gpu, naive_attention

AVAILABLE, REASON = gpu.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=REASON)


def cupy():
    import cupy
    return cupy


def on_device(x: np.ndarray) -> ag.Tensor:
    return ag.Tensor(cupy().asarray(x), requires_grad=True)


def host(t) -> np.ndarray:
    value = t.value if isinstance(t, ag.Tensor) else t
    assert isinstance(value, cupy().ndarray), f"expected a CuPy array, got {type(value).__name__}"
    return value.get()


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_flash_attention_through_the_kernels_matches_naive_on_the_host(rng, causal):
    """flash_attention(backend="cupy") on Tensors: the CUDA kernels in the engine's graph."""
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 70, 64), (1, 2, 45, 64), (1, 2, 45, 64))]
    device = [on_device(a) for a in arrays]
    reference = [ag.Tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    out_d = flash_attention(*device, causal=causal, backend="cupy")
    out_h = naive_attention(*reference, causal=causal)
    ag.sum(out_d * out_d).backward()
    ag.sum(out_h * out_h).backward()
    np.testing.assert_allclose(host(out_d), out_h.value, rtol=1e-4, atol=1e-5)
    for d, h in zip(device, reference):
        np.testing.assert_allclose(host(d.grad), h.grad, rtol=1e-3, atol=1e-4)


def test_trace_agrees_with_cupys_memory_pool(rng):
    """What the trace reports is the pool's used bytes, to the byte, and never host memory."""
    cp = cupy()
    pool = cp.get_default_memory_pool()
    x, w = on_device(rng.standard_normal((100, 50))), on_device(rng.standard_normal((50, 40)))
    host_array = np.ones((1000, 1000))  # 8 MB on the host: a GPU trace must not see it
    ag.trace.start_trace(device="gpu")
    try:
        start = pool.used_bytes()
        y = x @ w
        after_forward = ag.trace.snapshot_trace()
        forward_pool = pool.used_bytes() - start
        ag.sum(y).backward()
        del y
        after_backward = ag.trace.snapshot_trace()
        backward_pool = pool.used_bytes() - start
    finally:
        ag.trace.end_trace()
    assert after_forward.allocated_bytes == forward_pool
    assert after_backward.allocated_bytes == backward_pool
    rounded = lambda n: -(-n // 512) * 512  # noqa: E731 (CuPy's pool hands out multiples of 512 bytes)
    assert forward_pool == rounded(100 * 40 * 8)
    assert backward_pool == rounded(100 * 50 * 8) + rounded(50 * 40 * 8)  # the grads of x and w
    assert after_backward.peak_bytes >= forward_pool + backward_pool
    assert host_array.nbytes == 8_000_000


def test_naive_attention_peaks_on_the_gpu_where_it_peaks_on_numpy(rng):
    """CuPy copies a stack's transposed operand before its product; ag's dV = (dOᵀ P)ᵀ keeps Pᵀ's N×N
    copy out, so the pool's peak is tracemalloc's on the host to within a quarter of an N×N array."""
    n = 1024
    arrays = [rng.standard_normal((1, 1, n, 64)).astype(np.float32) for _ in range(3)]
    peaks = []
    for xp, device in ((np, "cpu"), (cupy(), "gpu")):
        tensors = [ag.Tensor(xp.asarray(a), requires_grad=True) for a in arrays]
        ag.trace.start_trace(device)
        out = naive_attention(*tensors)
        out.backward(xp.ones(out.shape, np.float32))
        peaks.append(ag.trace.snapshot_trace().peak_bytes)
        ag.trace.end_trace()
        del out, tensors
    assert abs(peaks[1] - peaks[0]) < n * n * 4 / 4, [p / (n * n * 4) for p in peaks]


def test_the_attention_demo_measures_the_gpu_pool():
    """``ag demo attention --device gpu``'s table: naive's peak grows ×4 per doubling of N, flash's ×2."""
    from ag import demo
    rows = demo.attention_scaling(sizes=(1024, 2048, 4096), naive_up_to=4096, device="gpu")
    naive = [r.naive_bytes for r in rows]
    flash = [r.flash_bytes for r in rows]
    assert 3.5 < naive[2] / naive[1] < 4.5 and 1.8 < flash[2] / flash[1] < 2.2, (naive, flash)
    assert naive[2] > 10 * flash[2], (naive, flash)


def test_lecture_4s_gpu_table_is_what_the_demo_measures_on_the_gpu():
    """Note 4.9's table of CuPy pool peaks, to the 0.1 MB it prints, rerun on this GPU."""
    import re
    from pathlib import Path
    from ag import demo
    note = (Path(__file__).resolve().parent.parent / "lectures" / "04-io-and-flash-attention.md").read_text()
    section = note.split("## 4.9")[1].split("## Summary")[0]
    quoted = {int(n): (naive, flash) for n, naive, flash in
              re.findall(r"^\s*(\d+)\s+([\d.]+|\(skipped\))\s+([\d.]+)\s", section, re.M)}
    assert set(quoted) == {512, 1024, 2048, 4096, 8192, 16384}
    for peak in demo.attention_scaling(device="gpu"):
        naive, flash = quoted[peak.n]
        assert f"{peak.flash_bytes / ag.trace.MB:.1f}" == flash, peak
        assert (f"{peak.naive_bytes / ag.trace.MB:.1f}" if peak.naive_bytes is not None else "(skipped)") == naive, peak
