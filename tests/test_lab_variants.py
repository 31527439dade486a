"""The variants of ``flash_attention`` on the lab's threads (``ag.lab.flash_variants``): a window, both
causal conventions, softcap, ALiBi, dropout, a value head dim of its own and GQA give the classroom's
bits, forward and backward, for any number of workers, and the runs do go to other threads; and
``flash_decode``'s batch entries, shared the same way."""
import contextlib
import threading

import numpy as np
import pytest

import ag
from ag.attention import decode, flash_attention, flash_decode
from ag.attention.shapes import Heads
from ag.attention.tiles import Tiles
from ag.attention.variants import bh_index, variants
from ag.lab import sharing

pytest.importorskip("threadpoolctl", reason="workers > 1 needs the fast extra")

B, H, H_KV, N_Q, N_K, D, DV = 2, 4, 2, 70, 90, 12, 20
SLOPES = np.random.default_rng(5).uniform(0.1, 1.0, (B, H))
CASES = {
    "window both sides": dict(window_size=(9, 4)),
    "window, top-left causal": dict(causal=True, window_size=(20, -1)),
    "ALiBi (H,), bottom-right causal": dict(causal="bottom_right", alibi_slopes=SLOPES[0]),
    "ALiBi (B, H), top-left causal": dict(causal=True, alibi_slopes=SLOPES),
    "softcap": dict(softcap=2.5),
    "dropout": dict(dropout_p=0.25, seed=11),
    "everything": dict(causal="bottom_right", window_size=(30, 8), softcap=3.0, alibi_slopes=SLOPES,
                       dropout_p=0.2, seed=3),
}


@pytest.fixture
def threads_at_any_size(monkeypatch):
    """Threads for these small calls, which ``MIN_PRODUCTS_PER_THREAD`` would keep on the caller."""
    monkeypatch.setattr(sharing, "MIN_PRODUCTS_PER_THREAD", 1)


def step(arrays, weight, lab: bool, workers: int = 1, **options) -> list[np.ndarray]:
    """O and the grads of Σ O ∘ weight, on the classroom path or the lab's with ``workers`` threads."""
    tensors = [ag.Tensor(a, requires_grad=True) for a in arrays]
    previous = ag.lab.set_workers(workers)
    try:
        with ag.lab.on() if lab else contextlib.nullcontext():
            out = flash_attention(*tensors, block_q=16, block_k=32, **options)
            ag.sum(out * weight).backward()
    finally:
        ag.lab.set_workers(previous)
    return [out.value] + [t.grad for t in tensors]


def inputs(batch, h, h_kv, n_q, dtype, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(batch + shape).astype(dtype)
              for shape in ((h, n_q, D), (h_kv, N_K, D), (h_kv, N_K, DV))]
    return arrays, rng.standard_normal(batch + (h, n_q, DV)).astype(dtype)


def assert_same_bits(want, got, label):
    for name, w, g in zip(("O", "dq", "dk", "dv"), want, got):
        assert w.dtype == g.dtype and np.array_equal(w, g, equal_nan=True), f"{label}: {name} differs"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_each_variant_on_the_labs_threads_gives_the_classrooms_bits_for_any_workers(case, dtype, threads_at_any_size):
    arrays, weight = inputs((B,), H, H_KV, N_Q, dtype)
    want = step(arrays, weight, lab=False, **CASES[case])
    for workers in (1, 2, 3):
        assert_same_bits(want, step(arrays, weight, lab=True, workers=workers, **CASES[case]), f"{workers} workers")


@pytest.mark.parametrize("case", ["window, top-left causal", "ALiBi (B, H), top-left causal", "dropout", "everything"])
def test_one_head_cut_by_query_tile_keeps_the_calls_rows_for_window_alibi_and_dropout(case, threads_at_any_size):
    arrays, weight = inputs((1,), 2, 1, 100, np.float32, seed=1)  # GQA's one key/value head: runs of query tiles
    options = dict(CASES[case])
    if options.get("alibi_slopes") is not None:
        options["alibi_slopes"] = SLOPES[:1, :2]
    want = step(arrays, weight, lab=False, **options)
    for workers in (2, 3):
        assert_same_bits(want, step(arrays, weight, lab=True, workers=workers, **options), f"{workers} workers")


def test_a_windowed_call_runs_on_as_many_threads_as_workers(monkeypatch, threads_at_any_size):
    seen, scores = set(), Tiles.scores

    def spy(self, *args):
        seen.add(threading.current_thread().name)
        return scores(self, *args)
    monkeypatch.setattr(Tiles, "scores", spy)
    arrays, weight = inputs((B,), H, H_KV, N_Q, np.float64)
    step(arrays, weight, lab=True, workers=2, window_size=(9, 4))
    assert seen == {"ag-attention"}  # every tile on the lab's two threads, none on the caller's
    seen.clear()
    step(arrays, weight, lab=False, window_size=(9, 4))
    assert seen == {threading.current_thread().name}


def test_a_calls_share_takes_its_heads_slopes_and_dropout_counters_and_counts_rows_from_its_first():
    heads = Heads((B,), H, H_KV, N_Q, N_K, D)
    call = variants("test", heads, "bottom_right", (9, 4), alibi_slopes=SLOPES, dropout_p=0.5, seed=1)
    share = call.for_share(heads, (1,), slice(2, 4), first_row=16, n_q=16)
    np.testing.assert_array_equal(share.slopes, SLOPES[1, 2:4])
    np.testing.assert_array_equal(share.counters(heads), bh_index(heads)[1, 2:4])
    rows, cols = np.arange(16), np.arange(N_K)
    np.testing.assert_array_equal(share.visible(rows, cols), call.visible(rows + 16, cols))
    np.testing.assert_array_equal(share.bias(rows, cols, np.float64), call.bias(rows + 16, cols, np.float64)[1, 2:4])
    np.testing.assert_array_equal(share.keep(share.counters(heads), rows, cols, np.float64),
                                  call.keep(bh_index(heads)[1, 2:4], rows + 16, cols, np.float64))


def test_flash_decode_shares_its_batch_entries_among_the_labs_threads_with_the_classrooms_bits(monkeypatch,
                                                                                               threads_at_any_size):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((5, 4, 2, D))
    k_cache, v_cache = rng.standard_normal((5, 2, 60, D)), rng.standard_normal((5, 2, 60, DV))
    options = dict(cache_seqlens=np.array([60, 0, 17, 33, 1]), num_splits=3, window_size=(20, 0),
                   alibi_slopes=SLOPES[:1].repeat(5, axis=0), return_lse=True)
    want = flash_decode(q, k_cache, v_cache, **options)
    seen, decode_entry = set(), decode.decode_entry

    def spy(*args):
        seen.add(threading.current_thread().name)
        return decode_entry(*args)
    monkeypatch.setattr(decode, "decode_entry", spy)
    for workers in (1, 2, 3):
        previous = ag.lab.set_workers(workers)
        try:
            with ag.lab.on():
                got = flash_decode(q, k_cache, v_cache, **options)
        finally:
            ag.lab.set_workers(previous)
        assert all(np.array_equal(w, g) for w, g in zip(want, got)), f"{workers} workers"
    assert seen == {"ag-attention", threading.current_thread().name}  # 1 worker: the caller; 2 and 3: threads
