"""ag.attention: FlashAttention's tiled path against the standard one, PyTorch, and the math."""
import os

import numpy as np
import pytest

import ag
from ag import trace
from ag.attention.tiles import Tiles
from ag.attention import (flash_attention, merge_softmax_blocks, naive_attention, online_softmax,
                          softmax_block)
from gradcheck import grad_check

SIZES = [(1, 1), (7, 7), (33, 33), (127, 127), (257, 257), (7, 33), (33, 7), (127, 257), (257, 1)]
HEADS = [(8, 8), (8, 2), (8, 1)]


def qkv(n_q, n_k, d, h, h_kv, seed=0, dtype=np.float64, batch=(1,)):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(batch + (h, n_q, d)).astype(dtype),
            rng.standard_normal(batch + (h_kv, n_k, d)).astype(dtype),
            rng.standard_normal(batch + (h_kv, n_k, d)).astype(dtype))


def grads_of(attention, q, k, v, weight, **options):
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = attention(*tensors, **options)
    ag.sum(out * weight).backward()
    return out.value, [t.grad for t in tensors]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h, h_kv", HEADS)
@pytest.mark.parametrize("d", [8, 16, 64, 80])
@pytest.mark.parametrize("n_q, n_k", SIZES)
def test_flash_equals_naive_forward_and_all_three_gradients(n_q, n_k, d, h, h_kv, causal):
    q, k, v = qkv(n_q, n_k, d, h, h_kv)
    weight = np.random.default_rng(1).standard_normal(q.shape)
    o_naive, g_naive = grads_of(naive_attention, q, k, v, weight, causal=causal)
    o_flash, g_flash = grads_of(flash_attention, q, k, v, weight, causal=causal, block_q=32, block_k=16)
    np.testing.assert_allclose(o_flash, o_naive, rtol=0, atol=1e-10)
    for name, got, want in zip("qkv", g_flash, g_naive):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-10, err_msg=f"d{name}")


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_every_block_size_gives_the_same_answer(causal):
    q, k, v = qkv(100, 75, 16, 4, 2)
    weight = np.random.default_rng(1).standard_normal(q.shape)
    reference = grads_of(flash_attention, q, k, v, weight, causal=causal, block_q=256, block_k=256)
    for block_q, block_k in [(1, 1), (7, 5), (16, 64), (64, 16), (33, 100)]:
        out, grads = grads_of(flash_attention, q, k, v, weight, causal=causal, block_q=block_q, block_k=block_k)
        np.testing.assert_allclose(out, reference[0], rtol=0, atol=1e-12)
        for got, want in zip(grads, reference[1]):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_gradients_match_finite_differences(causal):
    q, k, v = qkv(5, 4, 3, 2, 1)
    grad_check(lambda q, k, v: flash_attention(q, k, v, causal=causal, block_q=2, block_k=3), q, k, v)


@pytest.mark.parametrize("causal", [False, True])
def test_naive_gradients_match_finite_differences(causal):
    q, k, v = qkv(4, 5, 3, 2, 2)
    grad_check(lambda q, k, v: naive_attention(q, k, v, causal=causal), q, k, v)


def test_arrays_in_give_arrays_out_and_tensors_in_give_a_tensor():
    q, k, v = qkv(9, 9, 4, 2, 2)
    assert isinstance(flash_attention(q, k, v), np.ndarray)
    assert isinstance(naive_attention(q, k, v), np.ndarray)
    assert isinstance(flash_attention(ag.Tensor(q), k, v), ag.Tensor)


def test_the_saved_logsumexp_is_the_logsumexp_of_the_scaled_scores():
    q, k, v = qkv(40, 30, 8, 4, 2)
    _, lse = flash_attention(q, k, v, scale=0.3, block_q=16, block_k=8, return_lse=True)
    scores = 0.3 * np.einsum("bhgqd,bhkd->bhgqk", q.reshape(1, 2, 2, 40, 8), k)
    m = scores.max(axis=-1, keepdims=True)
    expected = (m + np.log(np.exp(scores - m).sum(axis=-1, keepdims=True)))[..., 0].reshape(1, 4, 40)
    np.testing.assert_allclose(lse, expected, rtol=1e-13)


def test_non_causal_attention_is_invariant_to_permuting_keys_and_values_together():
    q, k, v = qkv(20, 30, 8, 4, 4)
    perm = np.random.default_rng(3).permutation(30)
    np.testing.assert_allclose(flash_attention(q, k[..., perm, :], v[..., perm, :], block_k=7),
                               flash_attention(q, k, v, block_k=7), rtol=0, atol=1e-13)


@pytest.mark.parametrize("causal", [False, True])
def test_a_nan_in_one_query_row_gives_nan_in_that_row_only_as_in_naive_attention(causal):
    """Not 0: the guard against 0/0 for a row that sees nothing must not also swallow a NaN."""
    q, k, v = qkv(40, 40, 8, 4, 2)
    q[0, 1, 7, 3] = np.nan
    weight = np.ones(q.shape)
    with np.errstate(invalid="ignore"):
        expected = grads_of(naive_attention, q, k, v, weight, causal=causal)
        got = grads_of(flash_attention, q, k, v, weight, causal=causal, block_q=16, block_k=8)
    nan_rows = np.isnan(got[0]).any(axis=-1)
    assert nan_rows.sum() == 1 and nan_rows[0, 1, 7]
    # o and dq everywhere; dk and dv (NaN for every key of that head's group) where no mask
    # decides whether a masked-out score's NaN is multiplied by 0
    pairs = [(got[0], expected[0]), (got[1][0], expected[1][0])]
    if not causal:
        pairs += list(zip(got[1][1:], expected[1][1:]))
    for g, e in pairs:
        np.testing.assert_array_equal(np.isnan(g), np.isnan(e))
        np.testing.assert_allclose(np.nan_to_num(g), np.nan_to_num(e), rtol=0, atol=1e-10)


@pytest.mark.parametrize("causal, n_q", [(True, 40), ("bottom_right", 24)])
def test_a_nan_in_a_key_reaches_only_the_rows_that_see_it_as_in_naive_attention(causal, n_q):
    """A masked score is -inf whatever Q Kᵀ gave: adding a -inf mask left NaN + (-inf) = NaN, and a
    NaN in key 30 reached the rows of its diagonal tile that cannot see it."""
    q, k, v = qkv(n_q, 40, 8, 4, 2)
    k[0, 1, 30, 3] = np.nan
    with np.errstate(invalid="ignore"):
        expected = naive_attention(q, k, v, causal=causal)
        got, lse = flash_attention(q, k, v, causal=causal, block_q=16, block_k=16, return_lse=True)
    first_to_see = 30 - (40 - n_q if causal == "bottom_right" else 0)
    blind = np.arange(n_q) < first_to_see
    assert np.isfinite(got[0, 2:4][:, blind]).all() and np.isfinite(lse[0, 2:4][:, blind]).all()
    assert np.isnan(got[0, 2:4][:, ~blind]).all(axis=-1).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(expected), rtol=0, atol=1e-12)


def test_fully_masked_rows_give_zero_output_and_zero_gradients_not_nan():
    q, k, v = qkv(12, 5, 4, 2, 1)  # bottom-right: query i sees keys 0..i-7, rows 0..6 see nothing
    weight = np.ones(q.shape)
    for attention in (flash_attention, naive_attention):
        out, grads = grads_of(attention, q, k, v, weight, causal="bottom_right")
        assert not np.isnan(out).any() and all(not np.isnan(g).any() for g in grads)
        np.testing.assert_array_equal(out[..., :7, :], 0)
        np.testing.assert_array_equal(grads[0][..., :7, :], 0)
    _, lse = flash_attention(q, k, v, causal="bottom_right", return_lse=True)
    assert np.isneginf(lse[..., :7]).all() and np.isfinite(lse[..., 7:]).all()


def test_top_left_causal_row_i_sees_keys_0_to_i_like_torch():
    q, k, v = qkv(6, 4, 2, 1, 1)
    out = flash_attention(q, k, v, causal=True)
    np.testing.assert_allclose(out[..., 0, :], v[..., 0, :])  # row 0 sees only key 0
    np.testing.assert_allclose(out[..., 5, :], flash_attention(q, k, v)[..., 5, :])  # late rows see all


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logits_of_1e4_do_not_overflow(dtype):
    q, k, v = qkv(16, 16, 4, 2, 2, dtype=dtype)
    q = q * (1e4 / np.abs(q).max())
    k = k / np.abs(k).max() * 2
    out, lse = flash_attention(q, k, v, scale=1.0, block_k=4, return_lse=True)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    np.testing.assert_allclose(out, naive_attention(q, k, v, scale=1.0), rtol=1e-4, atol=1e-4)


def test_results_are_deterministic_from_run_to_run():
    q, k, v = qkv(50, 50, 8, 4, 2)
    weight = np.ones(q.shape)
    first = grads_of(flash_attention, q, k, v, weight, causal=True, block_q=16, block_k=16)
    second = grads_of(flash_attention, q, k, v, weight, causal=True, block_q=16, block_k=16)
    np.testing.assert_array_equal(first[0], second[0])
    for a, b in zip(first[1], second[1]):
        np.testing.assert_array_equal(a, b)


def test_float32_inputs_give_float32_results_close_to_float64():
    q, k, v = qkv(64, 64, 16, 4, 2, dtype=np.float32)
    out = flash_attention(q, k, v, causal=True)
    assert out.dtype == np.float32
    reference = flash_attention(*(x.astype(np.float64) for x in (q, k, v)), causal=True)
    np.testing.assert_allclose(out, reference, rtol=1e-4, atol=1e-5)


def test_leading_batch_dimensions_are_kept():
    q, k, v = qkv(10, 12, 4, 4, 2, batch=(2, 3))
    out = flash_attention(q, k, v, block_q=4, block_k=5)
    assert out.shape == (2, 3, 4, 10, 4)
    np.testing.assert_allclose(out, naive_attention(q, k, v), atol=1e-12)


# ---- online softmax ----

def test_merging_two_blocks_gives_the_full_softmax_times_v():
    rng = np.random.default_rng(0)
    s, v = rng.standard_normal((5, 12)) * 3, rng.standard_normal((12, 4))
    merged = merge_softmax_blocks(softmax_block(s[:, :5], v[:5]), softmax_block(s[:, 5:], v[5:]))
    p = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(merged.o, (p / p.sum(axis=1, keepdims=True)) @ v, rtol=1e-13)


@pytest.mark.parametrize("block_size", [1, 3, 7, 64])
def test_online_softmax_matches_softmax_for_any_block_size(block_size):
    rng = np.random.default_rng(1)
    s, v = rng.standard_normal((2, 6, 20)) * 5, rng.standard_normal((2, 20, 3))
    o, lse = online_softmax(s, v, block_size)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(o, (p / p.sum(axis=-1, keepdims=True)) @ v, rtol=1e-12)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(axis=-1)), rtol=1e-12)


def test_online_softmax_of_a_row_with_nothing_visible_is_zero():
    s = np.full((1, 6), -np.inf)
    o, lse = online_softmax(s, np.ones((6, 2)), 4)
    np.testing.assert_array_equal(o, 0)
    assert np.isneginf(lse).all()


# ---- bad input ----

@pytest.mark.parametrize("attention", [flash_attention, naive_attention])
def test_mismatched_head_dims_are_refused(attention):
    q, k, v = qkv(4, 4, 8, 2, 2)
    with pytest.raises(ag.ShapeError, match="head dims differ: q has d = 8, k has d = 6"):
        attention(q, k[..., :6], v[..., :6])


@pytest.mark.parametrize("attention", [flash_attention, naive_attention])
def test_query_heads_must_be_a_multiple_of_kv_heads(attention):
    q, k, v = qkv(4, 4, 8, 6, 4)
    with pytest.raises(ag.ShapeError, match="6 query heads are not a multiple of 4 key/value heads"):
        attention(q, k, v)


@pytest.mark.parametrize("attention", [flash_attention, naive_attention])
def test_wrong_ranks_are_refused(attention):
    q, k, v = qkv(4, 4, 8, 2, 2)
    with pytest.raises(ag.ShapeError, match=r"at least 3 dimensions .* \(4, 8\)"):
        attention(q[0, 0], k[0, 0], v[0, 0])
    with pytest.raises(ag.ShapeError, match="same rank"):
        attention(q[0], k, v)


@pytest.mark.parametrize("option", ["block_q", "block_k"])
@pytest.mark.parametrize("size", [0, -4, 2.5])
def test_non_positive_block_sizes_are_refused(option, size):
    q, k, v = qkv(4, 4, 8, 2, 2)
    with pytest.raises(ValueError, match=f"{option} must be a positive integer"):
        flash_attention(q, k, v, **{option: size})


def test_an_unknown_causal_mode_is_refused():
    q, k, v = qkv(4, 4, 8, 2, 2)
    with pytest.raises(ValueError, match="causal must be"):
        flash_attention(q, k, v, causal="sideways")


# ---- memory ----

def _flash_step_peak(n, d=16, dtype=np.float32):
    q, k, v = qkv(n, n, d, 1, 1, dtype=dtype)
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    trace.start_trace()
    out = flash_attention(*tensors)
    after_forward = trace.snapshot_trace().allocated_bytes
    out.backward(np.ones(out.shape, dtype=dtype))
    peak = trace.snapshot_trace().peak_bytes
    trace.end_trace()
    return after_forward, peak


def _naive_step_peak(n, d=16, dtype=np.float32):
    q, k, v = qkv(n, n, d, 1, 1, dtype=dtype)
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    trace.start_trace()
    out = naive_attention(*tensors)
    out.backward(np.ones(out.shape, dtype=dtype))
    peak = trace.snapshot_trace().peak_bytes
    trace.end_trace()
    return peak


def test_no_n_by_n_array_is_alive_after_the_flash_forward():
    n = 2048
    after_forward, _ = _flash_step_peak(n)
    # O and the logsumexp: n·d + n floats; an n×n array would be 16 MB
    assert after_forward < n * n * 4 / 50


def test_flash_peak_grows_linearly_and_naive_quadratically():
    flash = [_flash_step_peak(n)[1] for n in (1024, 2048, 4096, 8192, 16384)]
    for small, large in zip(flash, flash[1:]):
        assert large / small < 2.3, flash
    naive = [_naive_step_peak(n) for n in (512, 1024, 2048)]
    for small, large in zip(naive, naive[1:]):
        assert large / small > 3.5, naive
    assert flash[2] * 10 < _naive_step_peak(4096)


# ---- PyTorch as the oracle ----

def _torch():
    if os.environ.get("AG_REQUIRE_TORCH") is None:
        return pytest.importorskip("torch")
    import torch
    return torch


@pytest.mark.oracle
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h, h_kv", HEADS)
@pytest.mark.parametrize("d", [8, 64, 80])
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (7, 33), (33, 7), (127, 127), (257, 127)])
def test_flash_matches_torch_scaled_dot_product_attention(n_q, n_k, d, h, h_kv, causal):
    torch = _torch()
    q, k, v = qkv(n_q, n_k, d, h, h_kv, seed=2)
    weight = np.random.default_rng(5).standard_normal(q.shape)
    out, grads = grads_of(flash_attention, q, k, v, weight, causal=causal, block_q=64, block_k=32)
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal,
                                                                enable_gqa=h != h_kv)
    (expected * torch.tensor(weight)).sum().backward()
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=0, atol=1e-10)
    for name, got, want in zip("qkv", grads, (tq.grad, tk.grad, tv.grad)):
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-10, err_msg=f"d{name}")


def test_the_cupy_backend_without_a_gpu_says_why(monkeypatch):
    from ag.attention import gpu
    monkeypatch.setattr(gpu, "available", lambda: (False, "cupy.cuda.is_available() is False"))
    q, k, v = qkv(4, 4, 8, 2, 2)
    with pytest.raises(RuntimeError, match=r"backend='cupy'\): cupy.cuda.is_available\(\) is False"):
        flash_attention(q, k, v, backend="cupy")


# ---- the score tiles ----

def test_score_tiles_are_written_into_one_buffer_per_pass_and_are_right(monkeypatch):
    handed_out = []  # (the tile as returned, a copy of its values then, the arguments)
    scores = Tiles.scores

    def spy(self, q_i, k_j, q_start, k_start):
        s = scores(self, q_i, k_j, q_start, k_start)
        handed_out.append((s, s.copy(), self, q_i, k_j, q_start, k_start))
        return s
    monkeypatch.setattr(Tiles, "scores", spy)
    q, k, v = qkv(70, 90, 8, 4, 2)  # edge tiles of 6 rows and 26 keys, a GQA group of 2
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = flash_attention(*tensors, causal=True, block_q=32, block_k=32)
    forward_tiles = len(handed_out)
    ag.sum(out).backward()
    for part in (handed_out[:forward_tiles], handed_out[forward_tiles:]):
        assert len(part) > 4
        assert all(np.shares_memory(part[0][0], s) for s, *_ in part[1:])
    for _, values, tiles, q_i, k_j, q_start, k_start in handed_out:
        expected = q_i @ np.swapaxes(k_j, -1, -2)
        rows, cols = np.arange(expected.shape[-2]) + q_start, np.arange(expected.shape[-1]) + k_start
        hidden = cols[None, :] > rows[:, None] + tiles.offset  # a tile's rows alone start at their offset
        np.testing.assert_array_equal(values, np.where(hidden, -np.inf, expected))
