"""ag's engine on real CuPy arrays on a GPU, against the same computation on NumPy.

tests/test_device_agnostic.py checks the engine with a CuPy stand-in, so that CI (no GPU) catches
a silent fall back to the host. This file runs the same models on the real thing: the MLP step,
naive attention with GQA, ``nn.TransformerLayer`` in all three recomputation modes, flash attention
through the CUDA kernels, and ``start_trace(device="gpu")`` against CuPy's memory pool. Skipped,
with the reason, where CuPy or a GPU is missing.
"""
import numpy as np
import pytest

import ag
from ag import nn
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


def test_mlp_forward_and_backward_stay_on_the_gpu(rng):
    arrays = [rng.standard_normal((64, 32)), rng.standard_normal((32, 32)), rng.standard_normal(32),
              rng.standard_normal((32, 8))]

    def mlp(x, w1, b1, w2):
        return ag.mean(ag.tanh(ag.relu(x @ w1 + b1) @ w2) * 2.0 - 1)

    device = [on_device(a) for a in arrays]
    reference = [ag.Tensor(a, requires_grad=True) for a in arrays]
    loss_d, loss_h = mlp(*device), mlp(*reference)
    loss_d.backward()
    loss_h.backward()
    np.testing.assert_allclose(host(loss_d), loss_h.value, rtol=1e-12)
    for d, h in zip(device, reference):
        np.testing.assert_allclose(host(d.grad), h.grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("causal", [False, True])
def test_naive_attention_with_gqa_runs_on_the_gpu(rng, causal):
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 37, 16), (2, 2, 37, 16), (2, 2, 37, 16)))
    device = [on_device(a) for a in (q, k, v)]
    reference = [ag.Tensor(a, requires_grad=True) for a in (q, k, v)]
    out_d = naive_attention(*device, causal=causal)
    out_h = naive_attention(*reference, causal=causal)
    ag.sum(out_d * out_d).backward()
    ag.sum(out_h * out_h).backward()
    np.testing.assert_allclose(host(out_d), out_h.value, rtol=1e-10)
    for d, h in zip(device, reference):
        np.testing.assert_allclose(host(d.grad), h.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("granularity", [None, "selective", "full"])
def test_a_transformer_layer_trains_on_the_gpu(rng, granularity):
    layer = nn.TransformerLayer(32, 4, num_query_groups=2, activations_checkpoint_granularity=granularity,
                                dtype=np.float64, seed=1)
    x, dy = rng.standard_normal((9, 2, 32)), rng.standard_normal((9, 2, 32))
    reference = ag.Tensor(x, requires_grad=True)
    out_h = layer(reference)
    out_h.backward(dy)
    host_grads = [p.grad.copy() for p in layer.parameters()]
    for p in layer.parameters():
        p.value, p.grad = cupy().asarray(p.value), None
    device = on_device(x)
    layer.calls = 0  # the same dropout masks as the host run
    out_d = layer(device)
    out_d.backward(cupy().asarray(dy))
    np.testing.assert_allclose(host(out_d), out_h.value, rtol=1e-10)
    np.testing.assert_allclose(host(device.grad), reference.grad, rtol=1e-9, atol=1e-12)
    for p, g in zip(layer.parameters(), host_grads):
        np.testing.assert_allclose(host(p.grad), g, rtol=1e-9, atol=1e-12)


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
