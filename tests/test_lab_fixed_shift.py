"""flash_attention's default forward: a fixed shift of 0 in place of the running max, checked after
each query tile, with the running max (``tiled_forward``) redoing the tiles whose scores leave exp's
range. It must give what the running max gives, for every mask, head grouping and dtype."""
import numpy as np
import pytest
from test_lab_attention import lab_flash

from ag.attention import naive_attention
from ag.lab import flash_loops as forward, flash_tiles as tiles_module
from ag.lab.flash_loops import fixed_shift_forward
from ag.attention.shapes import check_shapes
from ag.lab.flash_tiles import LabTiles as Tiles, longest_row


def qkv(n_q, n_k, d, h=2, h_kv=2, dtype=np.float64, seed=0, batch=(2,)):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(batch + (h, n_q, d)).astype(dtype),
            rng.standard_normal(batch + (h_kv, n_k, d)).astype(dtype),
            rng.standard_normal(batch + (h_kv, n_k, d)).astype(dtype))


@pytest.fixture
def redone(monkeypatch):
    """The (row offset, rows) of every query tile the running max redoes."""
    calls, running = [], forward.tiled_forward

    def spy(tiles, q, k, v, out=None):
        calls.append((tiles.offset, q.shape[-2]))
        return running(tiles, q, k, v, out=out)
    monkeypatch.setattr(forward, "tiled_forward", spy)  # where fixed_shift_forward looks it up
    return calls


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("n_q, n_k", [(70, 45), (45, 70), (64, 64), (1, 9)])
@pytest.mark.parametrize("h, h_kv", [(2, 2), (4, 1), (6, 3)])
def test_the_fixed_shift_gives_what_the_running_max_gives(n_q, n_k, h, h_kv, causal):
    q, k, v = qkv(n_q, n_k, 8, h, h_kv)
    fixed, lse_fixed = lab_flash(q, k, v, causal=causal, block_q=16, block_k=8, return_lse=True)
    running, lse_running = lab_flash(q, k, v, causal=causal, block_q=16, block_k=8, return_lse=True,
                                           shift="running")
    np.testing.assert_allclose(fixed, running, rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(np.isneginf(lse_fixed), np.isneginf(lse_running))
    seen = ~np.isneginf(lse_running)
    np.testing.assert_allclose(lse_fixed[seen], lse_running[seen], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(fixed, naive_attention(q, k, v, causal=causal), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("causal", [False, True])
def test_float32_stays_within_float32_rounding_of_float64(causal):
    q, k, v = qkv(300, 300, 64, 4, 2)
    exact = naive_attention(q, k, v, causal=causal)
    got = lab_flash(*(x.astype(np.float32) for x in (q, k, v)), causal=causal)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, exact, rtol=0, atol=2e-6)


def test_typical_scores_need_no_redo(redone):
    lab_flash(*qkv(200, 300, 16), block_q=64, block_k=64)
    lab_flash(*qkv(200, 300, 16), causal=True, block_q=64, block_k=64)
    assert redone == []


@pytest.mark.parametrize("score", [1e3, -1e3])
def test_a_row_whose_scores_leave_exps_range_has_only_its_query_tile_redone(redone, score):
    """Row 37 sees every key at the same score, e^1000 (overflows) or e^-1000 (underflows to 0):
    softmax is still uniform there, O the mean of V. Only the query tile holding it (rows 32..47)
    is redone, bit for bit as the running max computes it."""
    q, k, v = qkv(70, 45, 8, batch=())
    k[:] = 1.0
    q[:, 37] = score / 8 * np.sqrt(8)  # scale · q · k = score for every key
    fixed = lab_flash(q, k, v, block_q=16, block_k=8)
    assert redone == [(32, 16)]  # that query tile of both heads, which share one run
    running = lab_flash(q, k, v, block_q=16, block_k=8, shift="running")
    np.testing.assert_array_equal(fixed[:, 32:48], running[:, 32:48])
    np.testing.assert_allclose(fixed[:, 37], v.mean(axis=-2), rtol=1e-12)
    np.testing.assert_allclose(fixed, naive_attention(q, k, v), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_a_query_tile_redone_in_a_run_of_its_own_is_redone_at_its_rows(redone, causal, monkeypatch):
    """One head on two workers: each query tile is a run (``Tiles.for_rows``), and the tile that
    holds row 37 is redone there at its own rows, with the same bits as on one thread."""
    pytest.importorskip("threadpoolctl", reason="workers > 1 needs the fast extra")
    from ag.lab import flash, sharing
    monkeypatch.setattr(sharing, "MIN_PRODUCTS_PER_THREAD", 1)
    runs = []

    def run(tiles, q, k, v, out=None):
        runs.append(q.shape[-2])
        return fixed_shift_forward(tiles, q, k, v, out=out)
    monkeypatch.setattr(flash, "fixed_shift_forward", run)
    q, k, v = qkv(70, 90, 8, h=1, h_kv=1, batch=(1,))
    q[..., 37, :] = 1e3
    alone = lab_flash(q, k, v, causal=causal, block_q=16, block_k=8, workers=1, return_lse=True)
    shared = lab_flash(q, k, v, causal=causal, block_q=16, block_k=8, workers=2, return_lse=True)
    offset = 90 - 70 if causal == "bottom_right" else 0
    assert sorted(runs) == [6] + [16] * 4 + [70]  # the whole head on one thread, then a run a tile
    assert redone == [(32 + offset, 16)] * 2
    assert all(np.array_equal(a, b) for a, b in zip(alone, shared))
    np.testing.assert_allclose(shared[0], naive_attention(q, k, v, causal=causal), rtol=1e-12, atol=1e-13)


def test_rows_that_see_no_key_are_redone_and_give_zero_and_minus_infinity(redone):
    q, k, v = qkv(40, 24, 8)  # bottom-right: rows 0..15 see nothing
    o, lse = lab_flash(q, k, v, causal="bottom_right", block_q=16, block_k=8, return_lse=True)
    assert {offset for offset, _ in redone} == {-16}  # the first query tile: 24 - 40 + 0
    assert np.all(o[..., :16, :] == 0) and np.all(np.isneginf(lse[..., :16]))
    np.testing.assert_allclose(o, naive_attention(q, k, v, causal="bottom_right"), rtol=1e-12, atol=1e-13)


def test_a_nan_in_a_query_reaches_only_its_row():
    q, k, v = qkv(40, 40, 8)
    q[0, 1, 21, 3] = np.nan
    o = lab_flash(q, k, v, causal=True, block_q=16, block_k=8)
    assert np.isnan(o[0, 1, 21]).all()
    assert not np.isnan(np.delete(o[0, 1], 21, axis=0)).any() and not np.isnan(o[1]).any()


def tiles_for(q, k, v, causal=False, block_q=16, block_k=16):
    return Tiles(check_shapes("test", q, k, v), causal, 1 / np.sqrt(q.shape[-1]), block_q, block_k)


@pytest.mark.parametrize("base2", [True, False], ids=["exp2", "exp"])
def test_exp2_only_where_the_scores_are_bounded_and_unmasked(monkeypatch, base2):
    """e^S by exp2 on log2 e · q on an unmasked tile whose scores ‖q‖ · max ‖k‖ bounds within
    EXP2_SAFE where NumPy's exp2 is the fast one (``Tiles.base2``), by exp(ln 2 · S) on a masked
    one, and by exp where exp2 is not the fast one: all give e^S, masked entries exactly 0. The
    base-2 queries replace the tile's own copy: no second one is held."""
    monkeypatch.setattr(tiles_module, "EXP2_FAST", base2)
    q, k, v = qkv(32, 32, 8, batch=(), dtype=np.float32)
    tiles = tiles_for(q, k, v, causal=True)
    q_i, k_j, k_diag = tiles.scaled_queries(q, slice(16, 32)), k[..., 0:16, :], k[..., 16:32, :]
    natural = q_i.copy()
    assert tiles.bounded_queries(q_i, longest_row(k))
    np.testing.assert_array_equal(q_i, natural * np.float32(tiles_module.LOG2_E) if base2 else natural)
    s, s_diag = (np.matmul(natural, np.swapaxes(x, -1, -2)) for x in (k_j, k_diag))
    below = tiles.exp_scores(q_i, True, k_j, 16, 0).copy()  # a tile under the diagonal: no mask
    s2, s2_diag = (np.matmul(q_i, np.swapaxes(x, -1, -2)) for x in (k_j, k_diag))
    np.testing.assert_array_equal(below, np.exp2(s2) if base2 else np.exp(s))
    np.testing.assert_allclose(below, np.exp(s), rtol=2e-6)
    diagonal = tiles.exp_scores(q_i, True, k_diag, 16, 16).copy()
    visible = np.tril(np.ones((16, 16), bool))
    want = np.exp(s2_diag * np.float32(tiles_module.LN_2)) if base2 else np.exp(s_diag)
    np.testing.assert_array_equal(diagonal, np.where(visible, want, 0))
    np.testing.assert_allclose(diagonal, np.where(visible, np.exp(s_diag), 0), rtol=2e-6)
    far = natural * 100
    assert not tiles.bounded_queries(far, longest_row(k))  # ‖q‖ · ‖k‖ past EXP2_SAFE
    np.testing.assert_array_equal(far, natural * 100)  # left as it was


def test_exp2_is_taken_for_the_fast_one_only_on_linux_with_avx512(monkeypatch):
    """SVML's exp2, which NumPy builds for Linux on x86-64, runs where the CPU has Skylake-X's
    AVX-512; elsewhere exp2 is a scalar loop, slower than exp (BENCHMARKS.md, "History")."""
    from numpy._core._multiarray_umath import __cpu_features__ as features
    for has, platform, want in ((True, "linux", True), (False, "linux", False), (True, "win32", False),
                                (True, "darwin", False)):
        monkeypatch.setitem(features, "AVX512_SKX", has)
        monkeypatch.setattr(tiles_module.sys, "platform", platform)
        assert tiles_module.exp2_is_fast() is want


def test_key_slices_stop_at_the_last_key_a_query_tile_sees():
    q, k, v = qkv(64, 64, 8, batch=())
    tiles = tiles_for(q, k, v, causal=True, block_q=16, block_k=32)
    assert tiles.key_slices(16, 32) == [slice(0, 32)]
    assert tiles.key_slices(32, 48) == [slice(0, 32), slice(32, 48)]
    assert tiles_for(q, k, v, block_k=32).key_slices(0, 16) == [slice(0, 32), slice(32, 64)]


@pytest.mark.parametrize("causal", [True, "bottom_right"])
def test_the_tiles_of_some_rows_see_what_those_rows_saw(causal):
    q, k, v = qkv(40, 56, 8, batch=())
    tiles = tiles_for(q, k, v, causal=causal, block_q=8, block_k=8)
    rows = tiles.for_rows(16, 24)
    assert rows.heads.n_q == 8 and rows.key_tiles(0, 8) == tiles.key_tiles(16, 24)
    for k_start in range(0, 56, 8):
        whole, part = tiles.mask(16, k_start, 8, 8, np.float64), rows.mask(0, k_start, 8, 8, np.float64)
        assert (whole is None) == (part is None)
        if whole is not None:
            np.testing.assert_array_equal(np.isnan(whole), np.isnan(part))


def test_each_forward_counts_the_products_it_computes():
    """Causal, 16-row query tiles, 32-key tiles: the fixed shift cuts the last key tile of each
    query tile at its last visible key (16, 32, 32 + 16, 32 + 32 keys); the running max computes
    whole tiles (32, 32, 64, 64)."""
    import ag
    q, k, v = qkv(64, 64, 8, h=1, h_kv=1, batch=())
    counts = {}
    for shift in ("fixed", "running"):
        with ag.count_ops() as counts[shift]:
            lab_flash(q, k, v, causal=True, block_q=16, block_k=32, shift=shift)
    for shift, keys in (("fixed", 16 + 32 + 48 + 64), ("running", 32 + 32 + 64 + 64)):
        assert counts[shift].flops["forward"] == 2 * (2 * 16 * keys * 8)  # S = QKᵀ and PV, 2·m·n·k each


def test_fixed_shift_forward_fills_given_outputs_in_place():
    q, k, v = qkv(33, 20, 8)
    tiles = tiles_for(q, k, v, block_q=16, block_k=8)
    o, lse = np.zeros_like(q), np.full(q.shape[:-1], -np.inf)
    got = fixed_shift_forward(tiles, q, k, v, out=(o, lse))
    assert got[0] is o and got[1] is lse
    np.testing.assert_allclose(o, naive_attention(q, k, v), rtol=1e-12, atol=1e-13)


def test_a_query_tile_stops_at_the_key_tile_that_overflows_and_is_redone(redone, monkeypatch):
    """Row 5 scores e^1000 on key 0, in the first of four key tiles: the fixed shift makes no PV
    product for its query tile (it stops there), the running max makes its four, and the answer is
    the running max's, bit for bit."""
    import types
    q, k, v = qkv(16, 64, 8, h=1, h_kv=1, batch=())
    k[0, 0] = 1.0
    q[0, 5] = 1000 / k[0, 0].sum() * np.sqrt(8)  # scale · q_5 · k_0 = 1000
    pv_products = []

    def matmul(a, b, *args, **kwargs):
        pv_products.append(a.shape)
        return np.matmul(a, b, *args, **kwargs)
    from ag.attention import forward as paper_forward
    for module in (forward, paper_forward):
        monkeypatch.setattr(module, "np", types.SimpleNamespace(**{**vars(np), "matmul": matmul}))
    fixed = lab_flash(q, k, v, block_q=16, block_k=16)
    monkeypatch.undo()
    assert redone == [(0, 16)] and len(pv_products) == 4  # the running max's, none before
    running = lab_flash(q, k, v, block_q=16, block_k=16, shift="running")
    np.testing.assert_array_equal(fixed, running)
    np.testing.assert_allclose(fixed, naive_attention(q, k, v), rtol=1e-12, atol=1e-13)


def test_float16_runs_the_fixed_shift_in_float32_and_passes_its_check(redone):
    """float16 inputs reach the loops as float32 (``statistics_dtype``), where the check's bound fits."""
    q, k, v = (x.astype(np.float16) for x in qkv(40, 40, 8))
    fixed = lab_flash(q, k, v, causal=True, block_q=16, block_k=8)
    assert redone == [] and fixed.dtype == np.float16
    wide = lab_flash(*(x.astype(np.float32) for x in (q, k, v)), causal=True, block_q=16, block_k=8)
    np.testing.assert_array_equal(fixed, wide.astype(np.float16))
