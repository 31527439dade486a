"""FlashDecoding (ag.attention.decode) and packed batches (ag.attention.varlen) against the naive
reference, per-sequence calls and PyTorch; decoding's memory measured by tracemalloc."""
import importlib
import os
import tracemalloc

import numpy as np
import pytest

import ag
from ag.attention import flash_attention, naive_attention
from ag.attention.decode import flash_decode
from ag.attention.shapes import Heads
from ag.attention.variants import variants
from ag.attention.varlen import flash_attn_varlen, sequence_seed

torch = (pytest.importorskip("torch") if os.environ.get("AG_REQUIRE_TORCH") is None
         else importlib.import_module("torch"))


def cache(batch, h, h_kv, n_q, n_cache, d, dv=None, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, h, n_q, d)).astype(dtype),
            rng.standard_normal((batch, h_kv, n_cache, d)).astype(dtype),
            rng.standard_normal((batch, h_kv, n_cache, dv or d)).astype(dtype))


def naive_per_entry(q, k, v, seqlens, **options):
    """Each batch entry's naive attention over its filled slots; an entry with none gives 0."""
    out = np.zeros(q.shape[:-1] + v.shape[-1:])
    for b, n in enumerate(seqlens):
        if n:
            slopes = options.get("alibi_slopes")
            entry = dict(options, alibi_slopes=None if slopes is None else np.asarray(slopes)[b])
            out[b] = naive_attention(q[b], k[b, :, :n], v[b, :, :n], **entry)
    return out


# ---- flash_decode ----

@pytest.mark.parametrize("num_splits", [1, 2, 5, None])
@pytest.mark.parametrize("h, h_kv", [(8, 8), (8, 2), (8, 1)])
@pytest.mark.parametrize("n_q, causal", [(1, False), (3, "bottom_right"), (3, True)])
def test_flash_decode_equals_naive_over_each_entrys_filled_slots(n_q, causal, h, h_kv, num_splits):
    q, k, v = cache(4, h, h_kv, n_q, 300, 16, dv=12)
    seqlens = np.array([300, 129, 1, 0])
    got = flash_decode(q, k, v, cache_seqlens=seqlens, num_splits=num_splits, causal=causal)
    np.testing.assert_allclose(got, naive_per_entry(q, k, v, seqlens, causal=causal), rtol=0, atol=1e-13)


def test_flash_decode_with_a_window_softcap_and_alibi_equals_naive():
    q, k, v = cache(3, 4, 2, 2, 200, 8, seed=1)
    seqlens = np.array([200, 70, 5])
    options = dict(causal="bottom_right", window_size=(40, 0), softcap=4.0, alibi_slopes=np.full((3, 4), 0.3))
    got = flash_decode(q * 3, k, v, cache_seqlens=seqlens, num_splits=4, **options)
    np.testing.assert_allclose(got, naive_per_entry(q * 3, k, v, seqlens, **options), rtol=0, atol=1e-13)


def test_the_merged_logsumexp_is_the_rows_logsumexp_and_an_empty_entry_gets_minus_infinity():
    q, k, v = cache(2, 4, 4, 1, 64, 8)
    o, lse = flash_decode(q, k, v, cache_seqlens=np.array([64, 0]), num_splits=3, return_lse=True)
    s = np.einsum("hqd,hkd->hqk", q[0], k[0]) / np.sqrt(8)
    np.testing.assert_allclose(lse[0], np.log(np.exp(s).sum(-1)), rtol=1e-14)
    assert np.all(lse[1] == -np.inf) and np.array_equal(o[1], np.zeros_like(o[1]))


@pytest.mark.parametrize("h, h_kv", [(8, 8), (8, 2)])
def test_flash_decode_matches_torch_sdpa_on_a_decode_step(h, h_kv):
    q, k, v = cache(2, h, h_kv, 1, 513, 32, seed=3)
    want = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(x) for x in (q, k, v)), enable_gqa=h != h_kv)
    np.testing.assert_allclose(flash_decode(q, k, v, num_splits=7), want.numpy(), rtol=0, atol=1e-13)


def test_flash_decode_holds_one_splits_scores_not_a_row_of_the_caches_length():
    q, k, v = cache(1, 4, 4, 1, 16384, 32)
    row_of_scores = 4 * 16384 * 8  # one query's S over the whole cache, float64: 512 KiB
    peaks = {}
    for splits in (1, 32):
        tracemalloc.start()
        flash_decode(q, k, v, num_splits=splits)
        peaks[splits] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[1] >= row_of_scores  # one split: S is N keys long
    assert peaks[32] < row_of_scores / 2, peaks  # 32 splits: a split's S (16 KiB) and its partials
    assert peaks[32] < (k.nbytes + v.nbytes) / 100


@pytest.mark.parametrize("options, match", [
    (dict(cache_seqlens=[3, 2]), r"cache_seqlens must be 1 integers in \[0, 64\].*got \[3, 2\]"),
    (dict(cache_seqlens=np.array([65])), r"got array\(\[65\]\)"),
    (dict(num_splits=0), r"num_splits must be a positive integer or None, got 0"),
])
def test_flash_decode_names_a_bad_argument(options, match):
    q, k, v = cache(1, 2, 2, 1, 64, 8)
    with pytest.raises(ValueError, match=match):
        flash_decode(q, k, v, **options)


# ---- cu_seqlens: packed batches ----

CU_Q, CU_K = [0, 5, 6, 17, 24], [0, 9, 12, 30, 31]


def packed(h=4, h_kv=2, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((h, CU_Q[-1], d)), rng.standard_normal((h_kv, CU_K[-1], d)),
            rng.standard_normal((h_kv, CU_K[-1], d)))


@pytest.mark.parametrize("attention", ["flash", "naive"])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_a_packed_batch_equals_each_sequence_alone_with_gradients(attention, causal):
    q, k, v = packed()
    weight = np.random.default_rng(1).standard_normal(q.shape)
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = flash_attn_varlen(*tensors, CU_Q, CU_K, attention=attention, causal=causal)
    ag.sum(out * weight).backward()
    grads = [np.zeros_like(x) for x in (q, k, v)]
    for i in range(len(CU_Q) - 1):
        rows, cols = slice(CU_Q[i], CU_Q[i + 1]), slice(CU_K[i], CU_K[i + 1])
        alone = [ag.Tensor(np.ascontiguousarray(x[:, part]), requires_grad=True) for x, part in ((q, rows), (k, cols), (v, cols))]
        o = flash_attention(*alone, causal=causal)
        ag.sum(o * weight[:, rows]).backward()
        np.testing.assert_allclose(out.value[:, rows], o.value, rtol=0, atol=1e-12)
        for g, t, part in zip(grads, alone, (rows, cols, cols)):
            g[:, part] = t.grad
    for name, t, g in zip("qkv", tensors, grads):
        np.testing.assert_allclose(t.grad, g, rtol=0, atol=1e-12, err_msg=f"d{name}")


@pytest.mark.parametrize("causal", [False, True])
def test_a_packed_batch_matches_torch_sdpa_with_a_block_diagonal_mask(causal):
    q, k, v = packed(h=4, h_kv=4)
    seq_q = np.repeat(np.arange(4), np.diff(CU_Q))
    seq_k = np.repeat(np.arange(4), np.diff(CU_K))
    i = np.arange(CU_Q[-1]) - np.asarray(CU_Q)[seq_q]  # each token's place in its own sequence
    j = np.arange(CU_K[-1]) - np.asarray(CU_K)[seq_k]
    mask = seq_q[:, None] == seq_k[None, :]
    if causal:
        mask &= j[None, :] <= i[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(x) for x in (q, k, v)),
                                                            attn_mask=torch.tensor(mask))
    got = flash_attn_varlen(q, k, v, CU_Q, CU_K, causal=causal)
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("cu_q, cu_k, match", [
    ([0, 5, 23], CU_K[:3] + [31], r"cu_seqlens_q must rise from 0 to the 24 packed tokens.*got \[0, 5, 23\]"),
    ([1, 24], [0, 31], r"cu_seqlens_q must rise from 0"),
    ([0, 24], [0, 30, 12, 31], r"cu_seqlens_k must rise"),
    ([0, 24], [0, 12, 31], r"cu_seqlens_q has 1 sequences and cu_seqlens_k 2; they must agree"),
])
def test_packed_lengths_that_do_not_add_up_are_named(cu_q, cu_k, match):
    q, k, v = packed()
    with pytest.raises(ValueError, match=match):
        flash_attn_varlen(q, k, v, cu_q, cu_k)


def test_flash_decode_with_a_window_never_reads_the_keys_outside_it():
    q, k, v = cache(2, 4, 2, 1, 4096, 16, seed=7)
    k[..., :4096 - 65, :] = np.nan  # a read of any key outside the window would make O NaN
    v[..., :4096 - 65, :] = np.nan
    got = flash_decode(q, k, v, window_size=(64, 0), num_splits=3)
    want = naive_attention(q, k[..., -65:, :], v[..., -65:, :])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("window_size", [(-1, -1), (0, 0), (5, -1), (-1, 3), (7, 2)])
def test_a_windows_key_range_holds_every_visible_key_and_no_row_outside_it_sees_one(window_size, causal):
    extra = variants("test", Heads((), 1, 1, 20, 33, 8), causal, window_size)
    for first, stop in [(0, 20), (3, 9), (19, 20)]:
        lo, hi = extra.key_range(first, stop)
        visible = extra.visible(np.arange(first, stop), np.arange(33))
        seen = np.flatnonzero(visible.any(axis=0)) if visible is not None else np.arange(33)
        assert seen.size == 0 or (lo <= seen.min() and seen.max() < hi)
        assert seen.size == 0 or (lo == seen.min() and hi == seen.max() + 1)


@pytest.mark.parametrize("attention", ["flash", "naive"])
def test_a_packed_batch_with_a_window_and_alibi_equals_each_sequence_alone(attention):
    q, k, v = packed()
    slopes = np.random.default_rng(3).uniform(0, 1, (4, 4))  # (B, H): each sequence its own row
    got = flash_attn_varlen(q, k, v, CU_Q, CU_K, attention=attention, causal="bottom_right",
                            window_size=(4, 0), alibi_slopes=slopes)
    for i in range(len(CU_Q) - 1):
        rows, cols = slice(CU_Q[i], CU_Q[i + 1]), slice(CU_K[i], CU_K[i + 1])
        alone = naive_attention(q[:, rows], k[:, cols], v[:, cols], causal="bottom_right", window_size=(4, 0),
                                alibi_slopes=slopes[i])
        np.testing.assert_allclose(got[:, rows], alone, rtol=0, atol=1e-12)


def test_dropout_in_a_packed_batch_gives_each_sequence_its_own_mask_in_flash_and_naive_alike():
    q, k, v = packed()
    weight = np.random.default_rng(1).standard_normal(q.shape)
    steps = {}
    for attention in ("flash", "naive"):
        tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
        out = flash_attn_varlen(*tensors, CU_Q, CU_K, attention=attention, causal=True, dropout_p=0.3, seed=5)
        ag.sum(out * weight).backward()
        steps[attention] = [out.value] + [t.grad for t in tensors]
    for name, f, n in zip(("O", "dq", "dk", "dv"), steps["flash"], steps["naive"]):
        np.testing.assert_allclose(f, n, rtol=0, atol=1e-12, err_msg=name)
    for i in range(len(CU_Q) - 1):  # sequence i alone, with its own seed
        rows, cols = slice(CU_Q[i], CU_Q[i + 1]), slice(CU_K[i], CU_K[i + 1])
        alone = naive_attention(q[:, rows], k[:, cols], v[:, cols], causal=True, dropout_p=0.3,
                                seed=sequence_seed(5, i))
        np.testing.assert_allclose(steps["flash"][0][:, rows], alone, rtol=0, atol=1e-12)
    twice = [np.concatenate([x[:, :7]] * 2, axis=1) for x in (q, k, v)]
    o = flash_attn_varlen(*twice, [0, 7, 14], [0, 7, 14], dropout_p=0.5, seed=5)
    assert not np.allclose(o[:, :7], o[:, 7:]), "two equal sequences drew the same mask"
