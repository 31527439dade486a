"""flash_attention's default backward: the paper's Algorithm 2 with e^(S - L) taken as
2^(log2 e · S - log2 e · L) on the query tiles whose scores are known to stay within 80 of their
logsumexp. It must give what the paper's loop (``tiled_backward``, exercise 5) gives, for every
mask, head grouping and dtype, a row that sees nothing and a NaN included; and so where NumPy's exp2
is not the fast one (``Tiles.base2``) and bounded tiles take exp: every test runs both ways."""
import numpy as np
import pytest
from test_lab_attention import lab_flash

import ag
from ag.attention import naive_attention
from ag.lab import flash, flash_tiles as tiles_module
from ag.attention.shapes import check_shapes
from ag.lab.flash_tiles import EXP2_SAFE, LabTiles as Tiles
from test_lab_fixed_shift import qkv


@pytest.fixture(autouse=True, params=[True, False], ids=["exp2", "exp"])
def base2(request):
    """Bounded tiles by exp2 (an AVX-512 machine's path) or by exp (any other's), whichever this is."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiles_module, "EXP2_FAST", request.param)
        yield request.param


def grads(q, k, v, weight, **options):
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = lab_flash(*tensors, block_q=16, block_k=8, **options)
    ag.sum(out * weight).backward()
    return [t.grad for t in tensors]


def loops_run(monkeypatch) -> list[str]:
    """The names of the backward loops flash_attention runs, in order."""
    ran = []
    for name in ("base2_backward", "tiled_backward"):
        def spy(*args, _loop=getattr(flash, name), _name=name, **kwargs):
            ran.append(_name)
            return _loop(*args, **kwargs)
        monkeypatch.setattr(flash, name, spy)
    return ran


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("n_q, n_k", [(70, 45), (45, 70), (64, 64), (1, 9)])
@pytest.mark.parametrize("h, h_kv", [(2, 2), (4, 1), (6, 3)])
def test_base2_backward_gives_what_the_papers_backward_gives(monkeypatch, n_q, n_k, h, h_kv, causal):
    q, k, v = qkv(n_q, n_k, 8, h, h_kv)
    weight = np.random.default_rng(1).standard_normal(q.shape)
    ran = loops_run(monkeypatch)
    base2 = grads(q, k, v, weight, causal=causal)
    paper = grads(q, k, v, weight, causal=causal, shift="running")
    assert ran == ["base2_backward", "tiled_backward"]
    for got, want in zip(base2, paper):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)  # 0 where a row saw nothing
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    ag.sum(naive_attention(*tensors, causal=causal) * weight).backward()
    for got, t in zip(base2, tensors):
        np.testing.assert_allclose(got, t.grad, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_nan_reaches_the_same_gradients_as_in_the_papers_backward(dtype):
    q, k, v = qkv(40, 40, 8, dtype=dtype)
    k[0, 1, 13, 2] = np.nan  # one key of one head: every row of that head that sees it turns NaN
    weight = np.ones(q.shape, dtype)
    with np.errstate(invalid="ignore"):
        base2 = grads(q, k, v, weight, causal=True)
        paper = grads(q, k, v, weight, causal=True, shift="running")
    for got, want in zip(base2, paper):
        assert np.isnan(got).any()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


def tile_bounds(q, k, causal, scale_q=1.0):
    """Each query tile's bound from ``shift_bounded``, and the least visible S_ij - L_i in it,
    exactly, from the float64 scores and logsumexp."""
    q = q * scale_q
    heads = check_shapes("test", ag.Tensor(q), ag.Tensor(k), ag.Tensor(k))
    tiles = Tiles(heads, causal, 1 / np.sqrt(q.shape[-1]), 16, 8)
    _, lse = lab_flash(q, k, k, causal=causal, return_lse=True)
    group = q.shape[-3] // k.shape[-3]
    qg, kg = tiles.grouped(q, group), tiles.grouped(k, 1)
    lse_g = np.where(np.isneginf(lse), np.inf, lse).reshape(qg.shape[:-1] + (1,))
    s = np.matmul(qg, np.swapaxes(kg, -1, -2)) * tiles.scale - lse_g
    rows, cols = np.arange(q.shape[-2])[:, None], np.arange(k.shape[-2])[None, :]
    if causal:
        s = np.where(cols <= rows + tiles.offset, s, np.nan)
    least = [np.nanmin(s[..., a:a + 16, :], initial=np.inf) for a in range(0, q.shape[-2], 16)]
    return tiles.shift_bounded(qg, kg, lse_g), least, np.nanmax(s)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale_q", [0.1, 1.0, 4.0, 10.0, 30.0])
def test_a_tile_is_bounded_only_where_every_visible_score_minus_its_lse_is_in_range(causal, scale_q):
    bounded, least, most = tile_bounds(*qkv(80, 60, 16, 4, 2)[:2], causal, scale_q)
    assert most <= 1e-12  # S_ij <= L_i, the row's logsumexp
    for ok, low in zip(bounded, least):
        assert not ok or low >= -EXP2_SAFE
    if scale_q <= 1:
        assert all(bounded)
    if scale_q == 30:
        assert not any(bounded) and min(least) < -EXP2_SAFE  # an unbounded tile that had to be


def test_a_row_that_sees_nothing_leaves_its_tile_unbounded():
    q, k, _ = qkv(40, 20, 8)
    bounded, _, _ = tile_bounds(q, k, "bottom_right")  # rows 0..19 see no key
    assert bounded == [False, False, True]


def exp_calls(monkeypatch, q, k, v, causal) -> tuple[list[str], int]:
    """The exp and exp2 calls of ``ag.attention.tiles`` in flash's backward, by name, and the tiles
    that went through ``Tiles.exp``, the subnormal check."""
    calls, checked = [], []
    spying = type(np)("numpy_spy")
    spying.__dict__.update(vars(np))
    for name in ("exp", "exp2"):
        def spy(x, out=None, _f=getattr(np, name), _name=name):
            calls.append(_name)
            return _f(x, out=out)
        spying.__dict__[name] = spy
    exp = Tiles.exp
    monkeypatch.setattr(Tiles, "exp", staticmethod(lambda s: checked.append(1) or exp(s)))
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = lab_flash(*tensors, causal=causal, block_q=16, block_k=16)
    del checked[:]
    monkeypatch.setattr(tiles_module, "np", spying)
    ag.sum(out).backward()
    monkeypatch.undo()
    return calls, len(checked)


@pytest.mark.parametrize("causal", [False, True])
def test_bounded_tiles_take_exp2_without_a_mask_and_exp_unchecked_with_one(monkeypatch, causal, base2):
    q, k, v = qkv(64, 64, 8, 2, 2)
    calls, checked = exp_calls(monkeypatch, q, k, v, causal)
    pairs, diagonal = (4 * 5 // 2, 4) if causal else (4 * 4, 0)  # of one run's 4 x 4 tiles
    if not base2:  # every bounded tile by exp, none checked
        assert "exp2" not in calls and len(calls) % pairs == 0 and len(calls) >= pairs and checked == 0
        return
    runs = calls.count("exp2") // (pairs - diagonal)
    assert runs >= 1 and calls.count("exp2") == runs * (pairs - diagonal)
    assert calls.count("exp") == runs * diagonal and checked == 0


@pytest.mark.parametrize("causal", [False, True])
def test_peaked_tiles_take_the_checked_exp(monkeypatch, causal):
    q, k, v = qkv(64, 64, 8, 2, 2)
    calls, checked = exp_calls(monkeypatch, q * 30, k, v, causal)
    pairs = 4 * 5 // 2 if causal else 4 * 4
    assert calls == [] and checked > 0 and checked % pairs == 0  # every tile through Tiles.exp


def test_a_steps_peak_does_not_depend_on_which_exp_this_cpu_takes(monkeypatch):
    """exp2 or exp: each holds one scaled copy of a query tile, so lecture 4's measured table is the
    same on a CPU with AVX-512 and one without (it differed by 0.13 MB at N = 512 when the base-2
    copies came beside the natural ones)."""
    from ag import demo
    peaks = {}
    for fast in (True, False):
        monkeypatch.setattr(tiles_module, "EXP2_FAST", fast)
        peaks[fast] = [p.flash_bytes for p in demo.attention_scaling(sizes=(512, 1024), naive_up_to=0)]
    for with_exp2, with_exp in zip(peaks[True], peaks[False]):
        assert abs(with_exp2 - with_exp) < 8_000  # Python objects' noise: a key tile is 64 KB
