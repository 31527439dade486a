"""Offloading activations to disk: the values come back exactly, each read once and early, and the peak
falls below keeping everything."""
import os

import numpy as np
import pytest

import ag
from ag import offload
from test_device_agnostic import device  # noqa: F401  (the CuPy double here, CuPy itself where a GPU is)


def chain(n=6, rows=64, h=32, seed=0):
    rng = np.random.default_rng(seed)
    weights = [ag.Tensor(rng.standard_normal((h, h)) / np.sqrt(h), requires_grad=True) for _ in range(n)]
    layers = [lambda t, w=w: ag.tanh(t @ w) for w in weights]
    return weights, layers, ag.Tensor(rng.standard_normal((rows, h)))


def grads_after(step, weights):
    for w in weights:
        w.grad = None
    step()
    return [w.grad.copy() for w in weights]


def test_offloaded_grads_equal_keeping_everything_bit_for_bit():
    weights, layers, x = chain()
    kept = grads_after(offload.keep_step(layers, x), weights)
    moved = grads_after(offload.offload_step(layers, x), weights)
    for a, b in zip(kept, moved):
        np.testing.assert_array_equal(a, b)


def test_each_stored_value_is_read_back_once_and_all_but_the_first_early(tmp_path):
    weights, layers, x = chain(n=6)
    offloader = offload.Offloader(tmp_path)
    out = offload.offloaded(layers, x, offloader)
    assert [t.value for t in offloader.order] == [None] * 5  # dropped once the next layer read them
    assert sorted(os.listdir(tmp_path)) == [f"{i}.bin" for i in range(5)]
    out.backward(np.ones_like(out.value))
    offloader.close()
    assert offloader.bytes_read == offloader.bytes_written == 5 * 64 * 32 * 8
    assert offloader.early_reads == 4  # the last stored is read when backward first needs it; it starts the rest


def test_offloading_peaks_below_keeping_everything_and_recomputing_at_the_budget():
    weights, layers, x = chain(n=12, rows=256, h=64)
    one = 256 * 64 * 8
    found = offload.compare(layers, x, budget_bytes=8 * one, repeats=1)
    assert found["offload"]["peak_bytes"] < found["recompute"]["peak_bytes"] < found["keep"]["peak_bytes"]
    assert found["keep"]["peak_bytes"] >= 12 * one  # twelve outputs at least


def test_the_files_are_removed_after_the_step(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    weights, layers, x = chain(n=3)
    offload.offload_step(layers, x)()
    assert os.listdir(tmp_path) == []


def test_an_offloader_refuses_a_folder_that_does_not_exist(tmp_path):
    with pytest.raises(ValueError, match=r"'.*missing' is not a directory; expected an existing folder"):
        offload.Offloader(tmp_path / "missing")


def test_on_a_device_offloaded_grads_equal_keeping_everything_bit_for_bit_and_the_pool_peaks_lower(device):
    """Each output goes to host memory (``.get()``) and comes back (``asarray``) for backward; the device
    pool's peak (start_trace(device=...)) falls below keeping every output. Skipped without a GPU, with
    the reason, for real CuPy; the CuPy double runs everywhere."""
    n, rows, h = 8, 256, 64
    rng = np.random.default_rng(0)
    weights = [device.tensor((rng.standard_normal((h, h)) / np.sqrt(h)).astype(np.float32)) for _ in range(n)]
    layers = [lambda t, w=w: ag.tanh(t @ w) for w in weights]
    x = ag.Tensor(device.put(rng.standard_normal((rows, h)).astype(np.float32)))
    kept = [device.host(g) for g in grads_after(offload.keep_step(layers, x), weights)]
    moved = [device.host(g) for g in grads_after(offload.offload_step(layers, x), weights)]
    for a, b in zip(kept, moved):
        assert a.dtype == np.float32 and np.array_equal(a, b)
    peaks = {way: offload.measure_step(step, repeats=1, device=device.xp)["peak_bytes"]
             for way, step in (("keep", offload.keep_step(layers, x)), ("offload", offload.offload_step(layers, x)))}
    one = rows * h * 4
    assert peaks["keep"] >= n * one and peaks["offload"] <= peaks["keep"] - (n // 2) * one, peaks
