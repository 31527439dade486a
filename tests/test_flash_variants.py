"""FlashAttention's variants in the tiled loops: a sliding window (``window_size``), ALiBi
(``alibi_slopes``), a value head dim of its own, ``softcap`` and ``dropout_p``, against the naive
reference, forward and backward, on the classroom path and with the lab on; a window's work linear
in N; and dropout's mask drawn from the seed, never stored."""
import contextlib
import os
import tracemalloc

import numpy as np
import pytest

import ag
from ag.attention import flash_attention, naive_attention
from ag.attention.dropout import keep_mask

CASES = {  # n_q, n_k, causal, window_size, ALiBi, dv
    "window": (70, 90, False, (8, 3), False, 8),
    "window, top-left causal": (90, 70, True, (20, 0), False, 8),
    "window, left only": (33, 200, False, (5, -1), True, 8),
    "ALiBi, bottom-right causal": (64, 64, "bottom_right", (-1, -1), True, 8),
    "ALiBi, top-left causal, nq > nk": (80, 50, True, (-1, -1), True, 8),
    "dv of its own": (50, 70, True, (-1, -1), False, 24),
    "everything": (70, 90, "bottom_right", (16, 4), True, 12),
}


def step(attention, q, k, v, weight, **options):
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = attention(*tensors, **options)
    ag.sum(out * weight).backward()
    return [out.value] + [t.grad for t in tensors]


@pytest.mark.parametrize("lab", [False, True], ids=["classroom", "lab"])
@pytest.mark.parametrize("case", CASES)
def test_flash_with_a_variant_equals_naive_forward_and_backward(case, lab):
    n_q, n_k, causal, window_size, alibi, dv = CASES[case]
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 4, n_q, 8)), rng.standard_normal((2, 2, n_k, 8))
    v = rng.standard_normal((2, 2, n_k, dv))
    weight = rng.standard_normal((2, 4, n_q, dv))
    slopes = rng.uniform(0.1, 1, (2, 4)) if alibi else None
    options = dict(causal=causal, window_size=window_size, alibi_slopes=slopes)
    want = step(naive_attention, q, k, v, weight, **options)
    with ag.lab.on() if lab else contextlib.nullcontext():
        got = step(flash_attention, q, k, v, weight, block_q=16, block_k=32, **options)
    for name, g, w in zip(("O", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=name)


def test_a_window_visits_only_the_key_tiles_it_reaches_so_work_grows_linearly_in_n():
    flops = []
    for n in (512, 1024, 2048):
        q = np.random.default_rng(0).standard_normal((1, 1, n, 16))
        with ag.count_ops() as counts:
            flash_attention(q, q, q, window_size=(64, 0), block_q=64, block_k=64)
        flops.append(counts.flops["forward"])
    assert flops[2] - flops[1] == 2 * (flops[1] - flops[0])  # a fixed cost a row: linear, not quadratic
    full = 2 * 2 * 512 * 512 * 16  # S = QKᵀ and PV over every tile at N = 512
    assert flops[0] < full / 3


def test_a_row_whose_window_holds_one_key_gets_its_value_and_zero_grads_for_q_exactly():
    q, k, v, do = (np.random.default_rng(s).standard_normal((1, 2, 40, 8)) for s in range(4))
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = flash_attention(*tensors, window_size=(0, 0), block_q=16, block_k=16)  # each row: its diagonal key
    out.backward(do)
    np.testing.assert_array_equal(out.value, v)
    assert not tensors[0].grad.any() and not tensors[1].grad.any()


@pytest.mark.parametrize("option, value, match", [
    ("window_size", (3,), r"flash_attention: window_size must be \(left, right\)"),
    ("alibi_slopes", np.ones(3), r"flash_attention: alibi_slopes must have shape \(4,\)"),
])
def test_a_bad_variant_is_refused_with_flash_attentions_name(option, value, match):
    q = np.ones((1, 4, 8, 8))
    with pytest.raises((ValueError, ag.ShapeError), match=match):
        flash_attention(q, q, q, **{option: value})


def test_dropout_without_a_seed_is_refused_with_flash_attentions_name():
    q = np.zeros((1, 2, 4, 8))
    with pytest.raises(ValueError, match=r"flash_attention: dropout_p = 0.1 needs a seed"):
        flash_attention(q, q, q, dropout_p=0.1)


@pytest.mark.parametrize("option", [{"window_size": (2, 0)}, {"alibi_slopes": np.ones(2)}, {"softcap": 30.0},
                                    {"dropout_p": 0.1, "seed": 1}])
def test_the_cuda_kernels_refuse_a_variant_rather_than_ignore_it(option):
    q = np.zeros((1, 2, 4, 8), np.float32)
    with pytest.raises(ValueError, match=r"backend='cupy'\): the CUDA kernels take no window_size, alibi_slopes, "
                                         r"softcap or dropout_p"):
        flash_attention(q, q, q, backend="cupy", **option)


SOFTCAP_DROPOUT = {  # n_q, n_k, causal, window_size, softcap, dropout_p
    "softcap": (70, 90, False, (-1, -1), 1.5, 0.0),
    "softcap, top-left causal": (90, 70, True, (-1, -1), 4.0, 0.0),
    "dropout": (70, 90, False, (-1, -1), 0.0, 0.3),
    "dropout, bottom-right causal": (90, 70, "bottom_right", (-1, -1), 0.0, 0.1),
    "dropout, top-left causal, window": (70, 90, True, (16, 0), 0.0, 0.5),
    "both, bottom-right causal, window": (70, 90, "bottom_right", (20, 4), 2.0, 0.2),
}


@pytest.mark.parametrize("lab", [False, True], ids=["classroom", "lab"])
@pytest.mark.parametrize("block_q, block_k", [(16, 32), (7, 5), (256, 256)])
@pytest.mark.parametrize("case", SOFTCAP_DROPOUT)
def test_softcap_and_dropout_in_the_tiled_loops_equal_naive_for_any_tiling(case, block_q, block_k, lab):
    n_q, n_k, causal, window_size, softcap, dropout_p = SOFTCAP_DROPOUT[case]
    rng = np.random.default_rng(2)
    q = 3 * rng.standard_normal((2, 4, n_q, 8))
    k, v = rng.standard_normal((2, 2, n_k, 8)), rng.standard_normal((2, 2, n_k, 8))
    weight = rng.standard_normal((2, 4, n_q, 8))
    options = dict(causal=causal, window_size=window_size, softcap=softcap, dropout_p=dropout_p, seed=11)
    want = step(naive_attention, q, k, v, weight, **options)
    with ag.lab.on() if lab else contextlib.nullcontext():
        got = step(flash_attention, q, k, v, weight, block_q=block_q, block_k=block_k, **options)
    for name, g, w in zip(("O", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=name)


def test_dropout_in_the_tiled_loops_drops_something_and_depends_on_the_seed():
    q, k, v = (np.random.default_rng(s).standard_normal((1, 2, 40, 8)) for s in range(3))
    plain = flash_attention(q, k, v, block_q=16, block_k=16)
    first, again, other = (flash_attention(q, k, v, dropout_p=0.3, seed=s, block_q=16, block_k=16) for s in (5, 5, 6))
    assert np.array_equal(first, again)
    assert not np.allclose(first, plain) and not np.allclose(first, other)


def _torch_reference():
    if os.environ.get("AG_REQUIRE_TORCH") is None:
        pytest.importorskip("torch")
    import torch
    from attention_ref import attention_ref
    return torch, attention_ref


def _torch_step(q, k, v, do, upcast=True, **options):
    torch, attention_ref = _torch_reference()
    tensors = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = attention_ref(*tensors, upcast=upcast, **options)
    out.backward(torch.tensor(do))
    return [out.detach().numpy()] + [t.grad.numpy() for t in tensors]


def _flash_step(q, k, v, do, **options):
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = flash_attention(*tensors, block_q=32, block_k=48, **options)
    out.backward(do)
    return [out.value] + [t.grad for t in tensors]


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_softcap_and_dropout_match_flashattentions_reference_in_torch_with_the_same_mask(causal, dropout_p):
    rng = np.random.default_rng(3)
    q = 4 * rng.standard_normal((2, 4, 75, 16))
    k, v = rng.standard_normal((2, 2, 101, 16)), rng.standard_normal((2, 2, 101, 16))
    do = rng.standard_normal(q.shape)
    got = _flash_step(q, k, v, do, causal=causal, softcap=3.0, dropout_p=dropout_p, seed=21)
    mask = keep_mask(21, np.arange(8).reshape(2, 4), np.arange(75), np.arange(101), dropout_p) if dropout_p else None
    want = _torch_step(q, k, v, do, causal=causal, softcap=3.0, dropout_p=dropout_p, dropout_mask=mask)
    for name, g, w in zip(("O", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("causal", [False, "bottom_right"])
def test_softcap_in_float32_is_within_twice_torchs_own_error(causal):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 203, 64), (1, 2, 113, 64), (1, 2, 113, 64)))
    q *= 4
    do = rng.standard_normal(q.shape).astype(np.float32)
    want = _torch_step(q, k, v, do, causal=causal, softcap=5.0)
    theirs = _torch_step(q, k, v, do, upcast=False, causal=causal, softcap=5.0)
    ours = _flash_step(q, k, v, do, causal=causal, softcap=5.0)
    for name, o, t, w in zip(("O", "dq", "dk", "dv"), ours, theirs, want):
        assert o.dtype == np.float32, name
        bound = 2 * np.max(np.abs(t - w)) + 2 * np.finfo(np.float32).eps * 0.3  # FA3's rule
        assert np.max(np.abs(o - w)) <= bound, f"{name}: {np.max(np.abs(o - w)):.3g} against a bound of {bound:.3g}"


def _held_and_backward_peak(n: int, **options) -> tuple[int, int]:
    """Bytes tracemalloc sees held after flash_attention's forward on Tensors, and its backward's peak above that."""
    q, k, v, do = (np.random.default_rng(s).standard_normal((1, 1, n, 16)) for s in range(4))
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    tracemalloc.start()
    try:
        out = flash_attention(*tensors, block_q=128, block_k=128, **options)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out.backward(do)
        return held, tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()


def test_dropout_keeps_its_seed_not_an_n_by_n_mask_between_forward_and_backward():
    n = 2048
    _held_and_backward_peak(128, dropout_p=0.2, seed=1)  # first calls fill caches that later ones reuse
    plain, dropped = _held_and_backward_peak(n), _held_and_backward_peak(n, dropout_p=0.2, seed=1)
    assert dropped[0] - plain[0] < n * n / 8, "held after forward: not even a bit-packed N x N mask"
    assert dropped[1] - plain[1] < n * n / 4, "backward's peak: a tile's mask at a time, not a byte per entry of P"


def test_a_windows_memory_grows_linearly_in_n_and_holds_no_mask_beside_the_plain_steps():
    """tracemalloc: a window's forward and backward hold what the plain step holds (O, L, the grads,
    a tile's scores and mask), linear in N; its mask is made a tile at a time, never N × N."""
    window = dict(window_size=(64, 0), causal=True)
    _held_and_backward_peak(256, **window)  # first calls fill caches that later ones reuse
    step = {n: sum(_held_and_backward_peak(n, **window)) for n in (1024, 2048, 4096)}
    assert step[4096] - step[2048] < 2.5 * (step[2048] - step[1024]), step  # quadratic: 4 ×
    plain = sum(_held_and_backward_peak(4096, causal=True))
    assert step[4096] - plain < 4096 * 64, (step, plain)  # no N × N, nor N × window, array
