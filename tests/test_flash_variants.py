"""FlashAttention's variants in the tiled loops: a sliding window (``window_size``), ALiBi
(``alibi_slopes``) and a value head dim of its own, against the naive reference, forward and
backward, on the classroom path and with the lab on; and a window's work linear in N."""
import contextlib

import numpy as np
import pytest

import ag
from ag.attention import flash_attention, naive_attention

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


@pytest.mark.parametrize("option", [{"softcap": 30.0}, {"dropout_p": 0.1}])
def test_softcap_and_dropout_are_refused_by_the_tiled_loops_with_where_to_find_them(option):
    q = np.zeros((1, 2, 4, 8))
    with pytest.raises(ValueError, match=r"flash_attention: softcap = .* not in the tiled loops yet.*naive_attention"):
        flash_attention(q, q, q, **option)


@pytest.mark.parametrize("option", [{"window_size": (2, 0)}, {"alibi_slopes": np.ones(2)}])
def test_the_cuda_kernels_refuse_a_window_or_alibi_rather_than_ignore_it(option):
    q = np.zeros((1, 2, 4, 8), np.float32)
    with pytest.raises(ValueError, match=r"backend='cupy'\): the CUDA kernels take no window_size or alibi_slopes"):
        flash_attention(q, q, q, backend="cupy", **option)
