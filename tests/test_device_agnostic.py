"""The engine never pulls a device array to the host: it runs on any array module.

``fakedevice`` stands in for CuPy here (no GPU in CI): NumPy calls dispatch to its arrays,
and converting one to NumPy implicitly, or mixing one with a host array, raises TypeError,
as CuPy does. The models below also run on real CuPy where a GPU is (the ``device`` fixture;
skipped with the reason elsewhere), and tests/test_gpu_engine.py and test_gpu_attention.py check
the kernels and the memory pool there.
"""
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import pytest

import ag
import fakedevice
from ag import nn
from ag.attention import flash_attention, gpu, naive_attention
from ag.arrays import array_module


def on_device(x: np.ndarray) -> ag.Tensor:
    return ag.Tensor(fakedevice.to_device(x), requires_grad=True)


def host(t) -> np.ndarray:
    value = t.value if isinstance(t, ag.Tensor) else t
    assert isinstance(value, fakedevice.ndarray), f"expected a device array, got {type(value).__name__}"
    return value.get()


@dataclass(frozen=True)
class Device:
    """An array module that stands for a GPU: the double, or CuPy itself."""

    xp: ModuleType
    array: type

    def put(self, x: np.ndarray):
        return self.xp.asarray(x) if self.xp is not fakedevice else fakedevice.to_device(x)

    def tensor(self, x: np.ndarray) -> ag.Tensor:
        return ag.Tensor(self.put(x), requires_grad=True)

    def host(self, t) -> np.ndarray:
        value = t.value if isinstance(t, ag.Tensor) else t
        assert isinstance(value, self.array), f"expected a device array, got {type(value).__name__}"
        return value.get()


@pytest.fixture(params=["double", "cupy"])
def device(request) -> Device:
    if request.param == "double":
        return Device(fakedevice, fakedevice.ndarray)
    available, reason = gpu.available()
    if not available:
        pytest.skip(reason)
    import cupy
    return Device(cupy, cupy.ndarray)


def test_the_double_refuses_what_cupy_refuses():
    x = fakedevice.to_device(np.ones(3))
    with pytest.raises(TypeError, match="implicit conversion"):
        np.asarray(x)
    with pytest.raises(TypeError, match="host numpy.ndarray"):
        x + np.ones(3)
    assert array_module(x) is fakedevice and array_module(np.ones(1)) is np


def test_mlp_forward_and_backward_stay_on_the_device(rng, device):
    arrays = [rng.standard_normal((16, 8)), rng.standard_normal((8, 8)), rng.standard_normal(8),
              rng.standard_normal((8, 4))]

    def mlp(x, w1, b1, w2):
        return ag.mean(ag.tanh(ag.relu(x @ w1 + b1) @ w2) * 2.0 - 1)

    on_it = [device.tensor(a) for a in arrays]
    reference = [ag.Tensor(a, requires_grad=True) for a in arrays]
    loss_d, loss_h = mlp(*on_it), mlp(*reference)
    loss_d.backward()
    loss_h.backward()
    np.testing.assert_allclose(device.host(loss_d), loss_h.value, rtol=1e-12)
    for d, h in zip(on_it, reference):  # a GPU's BLAS adds in its own order: the last bits may differ
        np.testing.assert_allclose(device.host(d.grad), h.grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("causal", [False, True])
def test_naive_attention_with_gqa_runs_on_the_device(rng, causal, device):
    q, k, v = rng.standard_normal((1, 4, 6, 8)), rng.standard_normal((1, 2, 6, 8)), rng.standard_normal((1, 2, 6, 8))
    on_it = [device.tensor(a) for a in (q, k, v)]
    reference = [ag.Tensor(a, requires_grad=True) for a in (q, k, v)]
    out_d = naive_attention(*on_it, causal=causal)
    out_h = naive_attention(*reference, causal=causal)
    ag.sum(out_d * out_d).backward()
    ag.sum(out_h * out_h).backward()
    np.testing.assert_allclose(device.host(out_d), out_h.value, rtol=1e-10)
    for d, h in zip(on_it, reference):
        np.testing.assert_allclose(device.host(d.grad), h.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("granularity", [None, "selective", "full"])
def test_a_transformer_layer_trains_on_the_device(rng, granularity, device):
    layer = nn.TransformerLayer(16, 4, num_query_groups=2, activations_checkpoint_granularity=granularity,
                                dtype=np.float64, seed=1)
    x, dy = rng.standard_normal((5, 2, 16)), rng.standard_normal((5, 2, 16))
    reference = ag.Tensor(x, requires_grad=True)
    out_h = layer(reference)
    out_h.backward(dy)
    host_grads = [p.grad.copy() for p in layer.parameters()]
    for p in layer.parameters():
        p.value, p.grad = device.put(p.value), None
    on_it = device.tensor(x)
    layer.calls = 0  # the same dropout masks as the host run
    out_d = layer(on_it)
    out_d.backward(device.put(dy))
    np.testing.assert_allclose(device.host(out_d), out_h.value, rtol=1e-10)
    np.testing.assert_allclose(device.host(on_it.grad), reference.grad, rtol=1e-9, atol=1e-12)
    for p, g in zip(layer.parameters(), host_grads):
        np.testing.assert_allclose(device.host(p.grad), g, rtol=1e-9, atol=1e-12)


def test_rematerialized_chain_runs_on_the_device(rng, device):
    w = [device.tensor(rng.standard_normal((6, 6)) / 3) for _ in range(4)]
    layers = [lambda h, w=w_: ag.tanh(h @ w) for w_ in w]
    x = device.tensor(rng.standard_normal((3, 6)))
    out = ag.remat.sequential(layers, x, ag.remat.plan(4, "sqrt"))
    ag.sum(out).backward()
    assert all(isinstance(t.grad, device.array) for t in w + [x])


def test_the_double_copies_a_transposed_operand_of_a_stacked_product_as_cupy_does(rng):
    """CuPy's matmul makes each operand of a stack (ndim > 2) C-contiguous before its batched product
    (cupy/_core/_routines_linalg.pyx); the double does the same, in its pool."""
    p, g = (fakedevice.to_device(rng.standard_normal((1, 64, 64))) for _ in range(2))
    ag.trace.start_trace(device=fakedevice)
    try:
        np.matmul(p, g)
        contiguous = ag.trace.snapshot_trace().peak_bytes
        np.matmul(np.swapaxes(p, -1, -2), g)
        transposed = ag.trace.snapshot_trace().peak_bytes
    finally:
        ag.trace.end_trace()
    assert contiguous == p.nbytes and transposed == 2 * p.nbytes


def attention_step_peak(arrays, device) -> int:
    """Peak bytes of naive attention's forward + backward on these arrays, traced on ``device``."""
    xp = np if device == "cpu" else device
    tensors = [ag.Tensor(a if xp is np else fakedevice.to_device(a), requires_grad=True) for a in arrays]
    ag.trace.start_trace(device)
    try:
        out = naive_attention(*tensors)
        out.backward(xp.ones(out.shape))
        return ag.trace.snapshot_trace().peak_bytes
    finally:
        ag.trace.end_trace()


def test_naive_attention_peaks_on_the_device_where_it_peaks_on_numpy(rng):
    """dV = Pᵀ dO would copy Pᵀ, an N×N array, on CuPy (above); ag computes it as (dOᵀ P)ᵀ there, and
    the step's peak is the host's to within a quarter of one N×N array."""
    n = 256
    arrays = [rng.standard_normal((1, 1, n, 16)) for _ in range(3)]
    host_peak, device_peak = attention_step_peak(arrays, "cpu"), attention_step_peak(arrays, fakedevice)
    assert abs(device_peak - host_peak) < n * n * 8 / 4, (host_peak / (n * n * 8), device_peak / (n * n * 8))


def test_numpy_flash_attention_refuses_device_arrays_with_a_clear_error(rng):
    q = fakedevice.to_device(rng.standard_normal((1, 2, 4, 8)))
    with pytest.raises(TypeError, match="backend='numpy' needs NumPy arrays"):
        flash_attention(q, q, q, backend="numpy")


def test_trace_reads_the_device_memory_pool_not_tracemalloc(rng):
    x, w = on_device(rng.standard_normal((100, 50))), on_device(rng.standard_normal((50, 40)))
    host_array = np.ones((1000, 1000))  # 8 MB on the host: a GPU trace must not see it
    ag.trace.start_trace(device=fakedevice)
    try:
        y = x @ w
        after_forward = ag.trace.snapshot_trace()
        ag.sum(y).backward()
        del y
        after_backward = ag.trace.snapshot_trace()
    finally:
        ag.trace.end_trace()
    assert after_forward.allocated_bytes == 100 * 40 * 8
    assert after_backward.allocated_bytes == (100 * 50 + 50 * 40) * 8  # the grads of x and w
    assert after_backward.peak_bytes >= after_forward.allocated_bytes + after_backward.allocated_bytes
    assert host_array.nbytes == 8_000_000


def test_a_device_timeline_labels_every_op(rng):
    x, w = on_device(rng.standard_normal((8, 8))), on_device(rng.standard_normal((8, 8)))
    with ag.trace.tracing(device=fakedevice) as timeline:
        ag.sum(ag.relu(x @ w)).backward()
    assert [s.label for s in timeline][:3] == ["forward matmul", "forward relu", "forward sum"]
    assert timeline[0].allocated_bytes == 8 * 8 * 8


def test_gpu_tracing_without_cupy_says_what_is_missing(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ag.trace.TraceError, match="needs CuPy"):
        ag.trace.start_trace(device="gpu")


@pytest.fixture
def tiled_kernels(monkeypatch):
    """``ag.attention.gpu`` with its kernels replaced by NumPy's tiled loops on the double's arrays
    (the kernels themselves: tests/test_gpu_attention.py, on a GPU); records the calls."""
    from ag import attention
    from ag.attention import gpu
    from ag.attention.shapes import check_shapes, softmax_scale
    from ag.attention.tiles import Tiles
    calls = []

    def forward(q, k, v, *, causal, scale):
        calls.append("forward")
        o, lse = attention.flash_attention(q.get(), k.get(), v.get(), causal=causal, scale=scale, return_lse=True)
        return fakedevice.to_device(o), fakedevice.to_device(lse)

    def backward(q, k, v, o, lse, do, *, causal, scale):
        calls.append("backward")
        heads = check_shapes("test", q, k, v)
        tiles = Tiles(heads, causal, softmax_scale(scale, heads.d), 64, 64)
        grads = attention.tiled_backward(tiles, *(x.get() for x in (q, k, v, o, lse, do)))
        return tuple(fakedevice.to_device(g) for g in grads)
    monkeypatch.setattr(gpu, "available", lambda: (True, ""))
    monkeypatch.setattr(gpu, "forward", forward)
    monkeypatch.setattr(gpu, "backward", backward)
    return calls


def test_the_cupy_backend_plumbs_tensors_through_the_kernel_entry_points(rng, tiled_kernels):
    """The GPU path's autograd wiring, with the kernels replaced by NumPy's tiled loops."""
    arrays = [rng.standard_normal((1, 4, 9, 8)), rng.standard_normal((1, 2, 9, 8)), rng.standard_normal((1, 2, 9, 8))]
    device = [on_device(a) for a in arrays]
    reference = [ag.Tensor(a, requires_grad=True) for a in arrays]
    out_d = flash_attention(*device, causal=True, backend="cupy")
    out_h = naive_attention(*reference, causal=True)
    ag.sum(out_d * out_d).backward()
    ag.sum(out_h * out_h).backward()
    assert tiled_kernels == ["forward", "backward"]
    np.testing.assert_allclose(host(out_d), out_h.value, rtol=1e-10)
    for d, h in zip(device, reference):
        np.testing.assert_allclose(host(d.grad), h.grad, rtol=1e-9, atol=1e-12)


def test_the_attention_demo_measures_the_device_pool(tiled_kernels):
    """``ag demo attention --device gpu``'s table, with the double as the GPU and NumPy's tiles as
    the kernels: naive's peak grows ×4 per doubling of N, flash's ×2."""
    from ag import demo
    rows = demo.attention_scaling(sizes=(256, 512, 1024), naive_up_to=1024, device=fakedevice)
    naive = [r.naive_bytes for r in rows]
    flash = [r.flash_bytes for r in rows]
    assert 3.5 < naive[2] / naive[1] < 4.5 and 1.8 < flash[2] / flash[1] < 2.2, (naive, flash)
