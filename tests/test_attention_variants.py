"""Attention's variants under FlashAttention's names: Philox dropout, sliding windows, softcap, ALiBi,
a value head dim of its own, each in the naive reference and against FlashAttention's attention_ref."""
import importlib
import os

import numpy as np
import pytest

import ag
from ag.attention import naive_attention
from ag.attention.dropout import keep_mask, philox4x32
from gradcheck import grad_check

torch = (pytest.importorskip("torch") if os.environ.get("AG_REQUIRE_TORCH") is None
         else importlib.import_module("torch"))
from attention_ref import attention_ref  # noqa: E402 -- needs torch

# Random123's known-answer vectors for Philox4x32-10 (its tests/kat_vectors), also cuRAND's generator.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def qkv(n_q, n_k, d, h, h_kv, dv=None, seed=0, batch=(2,)):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(batch + (h, n_q, d)), rng.standard_normal(batch + (h_kv, n_k, d)),
            rng.standard_normal(batch + (h_kv, n_k, dv or d)))


def ag_and_torch(q, k, v, weight, **options):
    """O and (dq, dk, dv) from naive_attention and from attention_ref in float64, for one weighting of O."""
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = naive_attention(*tensors, **options)
    ag.sum(out * weight).backward()
    if options.get("dropout_p"):
        h = q.shape[-3]
        bh = np.arange(np.prod(q.shape[:-3]) * h).reshape(q.shape[:-2])
        options["dropout_mask"] = keep_mask(options.pop("seed"), bh, np.arange(q.shape[-2]),
                                            np.arange(k.shape[-2]), options["dropout_p"])
    tt = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    want = attention_ref(*tt, **options)
    (want * torch.tensor(weight)).sum().backward()
    return (out.value, [t.grad for t in tensors]), (want.detach().numpy(), [t.grad.numpy() for t in tt])


def assert_same(got, want, atol=1e-10):
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=atol, err_msg="O")
    for name, g, w in zip("qkv", got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=0, atol=atol, err_msg=f"d{name}")


# ---- Philox and the keep mask ----

@pytest.mark.parametrize("counter, key, expected", PHILOX_KAT)
def test_philox4x32_10_gives_random123s_known_answers(counter, key, expected):
    assert tuple(int(w) for w in philox4x32(counter, key)) == expected


def test_philox_on_arrays_gives_each_counter_its_own_known_answer():
    counters = [np.array([c[i] for c, _, _ in PHILOX_KAT]) for i in range(4)]
    keys = [np.array([k[i] for _, k, _ in PHILOX_KAT]) for i in range(2)]
    words = philox4x32(counters, keys)
    for j, (_, _, expected) in enumerate(PHILOX_KAT):
        assert tuple(int(w[j]) for w in words) == expected


def test_keep_mask_is_the_same_for_any_tiling_of_rows_and_columns():
    whole = keep_mask(11, np.arange(6).reshape(2, 3), np.arange(70), np.arange(131), 0.25)
    assert whole.shape == (2, 3, 70, 131)
    for rows, cols in [(slice(0, 16), slice(0, 32)), (slice(13, 70), slice(5, 131)), (slice(69, 70), slice(130, 131))]:
        tile = keep_mask(11, np.arange(6).reshape(2, 3), np.arange(70)[rows], np.arange(131)[cols], 0.25)
        np.testing.assert_array_equal(tile, whole[..., rows, cols])
    one_head = keep_mask(11, 4, np.arange(70), np.arange(131)[::-1], 0.25)
    np.testing.assert_array_equal(one_head, whole[1, 1][:, ::-1])


def test_keep_mask_keeps_one_minus_p_and_differs_by_seed_and_head():
    masks = {seed: keep_mask(seed, np.arange(4), np.arange(256), np.arange(256), 0.3) for seed in (1, 2)}
    for mask in masks.values():
        assert abs(mask.mean() - 0.7) < 0.005  # 262144 draws: the standard error is 0.0009
    assert (masks[1] != masks[2]).mean() > 0.3
    assert (masks[1][0] != masks[1][1]).mean() > 0.3
    assert keep_mask(1, 0, np.arange(8), np.arange(8), 0.0).all()


@pytest.mark.parametrize("p, seed, match", [(1.0, 0, r"dropout_p must be in \[0, 1\), got 1.0"),
                                            (-0.1, 0, r"got -0.1"),
                                            (0.5, -1, r"seed must be an integer in \[0, 2\^64\), got -1"),
                                            (0.5, 1.5, r"got 1.5")])
def test_keep_mask_rejects_a_bad_p_or_seed_by_name(p, seed, match):
    with pytest.raises(ValueError, match=match):
        keep_mask(seed, 0, np.arange(2), np.arange(2), p)


# ---- the naive reference's variants against FlashAttention's attention_ref ----

WINDOWS = [(-1, -1), (0, 0), (3, -1), (-1, 2), (5, 1), (40, 0)]


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("window_size", WINDOWS)
@pytest.mark.parametrize("n_q, n_k", [(9, 9), (5, 17), (17, 5)])
def test_a_sliding_window_matches_flash_attentions_local_mask(n_q, n_k, window_size, causal):
    q, k, v = qkv(n_q, n_k, 8, 4, 2)
    weight = np.random.default_rng(1).standard_normal(q.shape)
    got, want = ag_and_torch(q, k, v, weight, causal=causal, window_size=window_size)
    assert_same(got, want)


def test_a_row_whose_window_holds_no_key_gives_zero_and_a_row_with_one_gives_its_value():
    q, k, v = qkv(12, 4, 8, 2, 2)  # bottom right, window (0, 0): query i sees key i - 8 alone
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = naive_attention(*tensors, window_size=(0, 0))
    assert np.array_equal(out.value[..., :8, :], np.zeros_like(out.value[..., :8, :]))
    assert np.array_equal(out.value[..., 8:, :], v)
    ag.sum(out).backward()
    assert np.array_equal(tensors[0].grad, np.zeros_like(q)) and np.array_equal(tensors[1].grad, np.zeros_like(k))


@pytest.mark.parametrize("softcap", [0.5, 5.0, 50.0])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_matches_flash_attentions_tanh_cap(softcap, causal):
    q, k, v = qkv(13, 21, 16, 4, 1, seed=3)
    weight = np.random.default_rng(1).standard_normal(q.shape)
    assert_same(*ag_and_torch(q * 3, k, v, weight, causal=causal, softcap=softcap))


@pytest.mark.parametrize("slopes_shape", ["heads", "batch_heads"])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("n_q, n_k", [(11, 11), (6, 19), (19, 6)])
def test_alibi_matches_flash_attentions_distance_bias(n_q, n_k, causal, slopes_shape):
    q, k, v = qkv(n_q, n_k, 8, 4, 2, seed=4)
    slopes = 2.0 ** -np.arange(1, 5) if slopes_shape == "heads" else np.random.default_rng(2).uniform(0, 1, (2, 4))
    weight = np.random.default_rng(1).standard_normal(q.shape)
    assert_same(*ag_and_torch(q, k, v, weight, causal=causal, alibi_slopes=slopes))


@pytest.mark.parametrize("dropout_p", [0.1, 0.5])
@pytest.mark.parametrize("h, h_kv", [(4, 4), (4, 2), (4, 1)])
def test_dropout_drops_the_keep_masks_entries_and_scales_the_rest(dropout_p, h, h_kv):
    q, k, v = qkv(10, 23, 8, h, h_kv, seed=5)
    weight = np.random.default_rng(1).standard_normal(q.shape)
    assert_same(*ag_and_torch(q, k, v, weight, dropout_p=dropout_p, seed=123, causal=True))


def test_dropout_is_the_same_for_the_same_seed_and_differs_for_another():
    q, k, v = qkv(16, 16, 8, 2, 2)
    first, again = (naive_attention(q, k, v, dropout_p=0.3, seed=9) for _ in range(2))
    assert np.array_equal(first, again)
    assert not np.allclose(first, naive_attention(q, k, v, dropout_p=0.3, seed=10))


@pytest.mark.parametrize("h, h_kv", [(6, 6), (6, 3), (6, 1)])
def test_a_value_head_dim_of_its_own_matches_the_reference(h, h_kv):
    q, k, v = qkv(9, 14, 24, h, h_kv, dv=7, seed=6)
    weight = np.random.default_rng(1).standard_normal(q.shape[:-1] + (7,))
    got, want = ag_and_torch(q, k, v, weight, causal="bottom_right")
    assert got[0].shape == (2, h, 9, 7)
    assert_same(got, want)


def test_every_variant_at_once_matches_finite_differences():
    q, k, v = qkv(6, 9, 4, 2, 1, dv=3, batch=(1,))
    options = dict(causal="bottom_right", window_size=(3, 0), softcap=2.0, alibi_slopes=[0.5, 0.25],
                   dropout_p=0.2, seed=7)
    grad_check(lambda q, k, v: naive_attention(q, k, v, **options), q, k, v)


@pytest.mark.parametrize("options, error, match", [
    (dict(window_size=(-2, 0)), ValueError, r"window_size must be \(left, right\), two integers >= -1.*got \(-2, 0\)"),
    (dict(window_size=3), ValueError, r"got 3"),
    (dict(softcap=-1.0), ValueError, r"softcap must be a finite number >= 0 \(0 means none\), got -1.0"),
    (dict(alibi_slopes=[1.0, 2.0]), ag.ShapeError, r"alibi_slopes must have shape \(4,\) or \(2, 4\).*got \(2,\)"),
    (dict(dropout_p=0.5), ValueError, r"dropout_p = 0.5 needs a seed"),
    (dict(causal="diagonal"), ValueError, r"causal must be False, True \('top_left'\) or 'bottom_right'"),
])
def test_a_bad_variant_argument_is_named_in_the_error(options, error, match):
    q, k, v = qkv(3, 3, 4, 4, 2)
    with pytest.raises(error, match=match):
        naive_attention(q, k, v, **options)


def test_a_value_whose_keys_differ_from_ks_is_named_in_the_error():
    q, k, _ = qkv(3, 5, 4, 4, 2)
    with pytest.raises(ag.ShapeError, match=r"v must have k's shape but for its head dim.*got \(2, 2, 4, 4\)"):
        naive_attention(q, k, np.zeros((2, 2, 4, 4)))
