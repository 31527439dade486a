"""The lab's ``flash_attention`` on NumPy (``ag.lab.flash``): its runs of heads shared among threads
with the same bits for any number of workers, its tiles, and its exp that flushes subnormals."""
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import ag
from ag.attention import flash_attention, naive_attention
from ag.lab import flash, flash_loops
from ag.lab.flash_tiles import LabTiles
from ag.lab import seams
from test_attention import grads_of, qkv

# the names these tests patch or read, where the lab keeps them
attention = SimpleNamespace(fixed_shift_forward=flash_loops.fixed_shift_forward,
                            base2_backward=flash_loops.base2_backward, Tiles=LabTiles,
                            DEFAULT_BLOCK_Q=flash.DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K=flash.DEFAULT_BLOCK_K,
                            DEFAULT_BLOCK_Q_FORWARD_UNMASKED=flash.DEFAULT_BLOCK_Q_FORWARD_UNMASKED,
                            DEFAULT_BLOCK_K_FORWARD_UNMASKED=flash.DEFAULT_BLOCK_K_FORWARD_UNMASKED)


def lab_flash(*args, workers=None, shift="fixed", **options):
    """``flash_attention`` with the lab on and ``workers`` threads (None: the cores), its fixed-shift
    passes (``flash.fixed_shift_passes``); ``shift="running"``: its default, the paper's loops."""
    previous = ag.lab.set_workers(workers)
    try:
        with ag.lab.on():
            if shift == "fixed":
                seams.swap({"flash_passes": flash.fixed_shift_passes})
            return flash_attention(*args, **options)
    finally:
        ag.lab.set_workers(previous)


# ---- workers: the heads shared out among threads ----

@pytest.fixture
def threads_at_any_size(monkeypatch):
    """Threads for the small arrays of these tests, which ``MIN_PRODUCTS_PER_THREAD`` keeps on the caller."""
    from ag.lab import sharing
    monkeypatch.setattr(sharing, "MIN_PRODUCTS_PER_THREAD", 1)


def test_a_call_too_small_to_share_runs_on_the_callers_thread_with_blas_at_one_thread(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl", reason="workers > 1 needs the fast extra")
    from ag.lab import sharing
    seen, forward = [], attention.fixed_shift_forward
    # the BLAS libraries loaded when ag first limits them, NumPy's among them; one loaded later
    # (scipy's, by a test run before this one) does no work for attention and is not limited
    held = {c.filepath for c in sharing.blas_threads().lib_controllers if c.user_api == "blas"}

    def spy(*args, **kwargs):
        blas = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["filepath"] in held]
        seen.append((threading.get_ident(), blas))
        return forward(*args, **kwargs)
    monkeypatch.setattr(flash, "fixed_shift_forward", spy)
    q, k, v = qkv(128, 128, 16, 4, 4, dtype=np.float32, batch=(2,))  # 2 · 4 · 128² · 16 = 2^21 products
    assert sharing.threads_for(2 * 4 * 128 * 128 * 16, 2) == 1
    assert sharing.threads_for(2 * sharing.MIN_PRODUCTS_PER_THREAD, 4) == 2
    lab_flash(q, k, v, workers=2)
    assert seen and all(t == threading.get_ident() and set(b) == {1} for t, b in seen)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h, h_kv", [(8, 8), (8, 2), (6, 3), (4, 1)])
def test_workers_give_bit_identical_outputs_and_gradients(h, h_kv, causal, threads_at_any_size):
    pytest.importorskip("threadpoolctl", reason="workers > 1 needs the fast extra")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((2, n, 100, 16)).astype(np.float32) for n in (h, h_kv, h_kv)]
    results = []
    for workers in (1, 2, 3, None):
        ts = [ag.Tensor(a, requires_grad=True) for a in arrays]
        out = lab_flash(*ts, causal=causal, workers=workers, block_q=32, block_k=48)
        ag.sum(out * out).backward()
        results.append([out.value] + [t.grad for t in ts])
    for other in results[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(results[0], other))
    ts = [ag.Tensor(a, requires_grad=True) for a in arrays]
    expected = naive_attention(*ts, causal=causal)
    ag.sum(expected * expected).backward()
    for got, want in zip(results[0], [expected.value] + [t.grad for t in ts]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cols", [1, 7, 48, 512])
def test_row_max_and_row_sum_of_a_tile_equal_numpys(cols, dtype):
    from ag.attention.shapes import Heads
    tiles = LabTiles(Heads((1,), 2, 2, 64, 512, 8), False, 0.5, 32, 48)
    s = np.random.default_rng(cols).standard_normal((2, 32, cols)).astype(dtype)
    s[0, 3] = -np.inf  # a row with nothing visible
    np.testing.assert_array_equal(tiles.row_max(s), np.max(s, axis=-1, keepdims=True))
    p = np.exp(s)
    np.testing.assert_allclose(tiles.row_sum(p), np.sum(p, axis=-1, keepdims=True),
                               rtol=4 * cols * np.finfo(dtype).eps)
    assert tiles.row_sum(p).dtype == dtype and tiles.row_sum(p[:, :, :1]).shape == (2, 32, 1)


@pytest.mark.parametrize("causal", [False, True])
def test_default_tiles_are_512_by_512_in_an_unmasked_forward_and_256_by_256_otherwise(causal, monkeypatch):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 1100, 16)).astype(np.float32) for _ in range(3))
    unmasked = attention.DEFAULT_BLOCK_Q_FORWARD_UNMASKED, attention.DEFAULT_BLOCK_K_FORWARD_UNMASKED
    assert unmasked == (512, 512) and (attention.DEFAULT_BLOCK_Q, attention.DEFAULT_BLOCK_K) == (256, 256)
    forward_tile = (256, 256) if causal else unmasked
    seen, reserve = [], attention.Tiles.reserve_scores

    def spy(self, dtype):  # the forward's tiles, before its loops
        seen.append((self.block_q, self.block_k))
        return reserve(self, dtype)
    monkeypatch.setattr(attention.Tiles, "reserve_scores", spy)
    default = lab_flash(q, k, v, causal=causal)
    assert set(seen) == {forward_tile}
    same = lab_flash(q, k, v, causal=causal, block_q=forward_tile[0], block_k=forward_tile[1])
    assert np.array_equal(default, same)
    seen.clear()
    lab_flash(q, k, v, causal=causal, block_q=128)  # a tile size given is kept
    assert set(seen) == {(128, 256 if causal else 512)}
    weight = rng.standard_normal(q.shape).astype(np.float32)
    _, grads = grads_of(lab_flash, q, k, v, weight, causal=causal)
    _, expected = grads_of(naive_attention, q, k, v, weight, causal=causal)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


def _flash_in_a_forked_child(arrays, queue):
    queue.put(lab_flash(*arrays, workers=2, block_q=32, block_k=32))


def test_workers_run_in_a_child_forked_after_the_parent_used_them(threads_at_any_size):
    """Threads kept from an earlier call would not be in a forked child: a pool handed over would
    wait forever for them (BENCHMARKS.md, "History": why workers start their threads per call)."""
    pytest.importorskip("threadpoolctl", reason="workers > 1 needs the fast extra")
    import multiprocessing
    arrays = qkv(64, 64, 8, 4, 4, dtype=np.float32)
    expected = lab_flash(*arrays, workers=2, block_q=32, block_k=32)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_flash_in_a_forked_child, args=(arrays, queue))
    child.start()
    try:
        got = queue.get(timeout=60)
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("failing", ["first", "second"])
def test_a_workers_error_reaches_the_caller_and_blas_gets_its_threads_back(monkeypatch, failing, threads_at_any_size):
    threadpoolctl = pytest.importorskip("threadpoolctl", reason="workers > 1 needs the fast extra")

    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    before = blas_threads()
    forward = attention.fixed_shift_forward
    arrays = qkv(32, 32, 8, 4, 4, dtype=np.float32)

    def fails_on_one_share(tiles, q, k, v, out=None):
        first = k.__array_interface__["data"][0] == arrays[1].__array_interface__["data"][0]
        if first == (failing == "first"):
            raise RuntimeError("a worker failed")
        return forward(tiles, q, k, v, out=out)
    monkeypatch.setattr(flash, "fixed_shift_forward", fails_on_one_share)
    with pytest.raises(RuntimeError, match="a worker failed"):
        lab_flash(*arrays, workers=2)
    assert blas_threads() == before


@pytest.mark.parametrize("workers", [0, -2, 1.5, True, "2"])
def test_a_bad_number_of_workers_is_refused(workers):
    q = np.ones((1, 2, 4, 4), np.float32)
    with pytest.raises(ValueError, match="workers must be a positive integer or None"):
        lab_flash(q, q, q, workers=workers)


@pytest.mark.parametrize("causal", [False, True])
def test_score_buffers_forwards_from_the_callers_thread_backwards_in_each_threads_loop_all_freed(monkeypatch, causal, threads_at_any_size):
    """Allocated on a fresh thread, the forward's came from its malloc arena, which had sometimes
    given its pages back: 1,000 page faults in a call (BENCHMARKS.md, "History"). The backward's
    are allocated in each thread's first loop, so as not to sit beside D's temporary."""
    pytest.importorskip("threadpoolctl", reason="workers > 1 needs the fast extra")
    allocated, used, in_loop, looping = [], [], threading.local(), []
    score_tile = attention.Tiles._score_tile

    def spy(self, shape, dtype):
        before = self._scores
        s = score_tile(self, shape, dtype)
        if self._scores is not before:
            allocated.append((threading.get_ident(), getattr(in_loop, "pass_", None)))
        used.append(self)
        return s

    def looped(name):
        loop = getattr(attention, name)

        def run(*args, **kwargs):
            in_loop.pass_ = name
            looping.append((threading.get_ident(), name))
            try:
                return loop(*args, **kwargs)
            finally:
                in_loop.pass_ = None
        return run
    monkeypatch.setattr(attention.Tiles, "_score_tile", spy)
    for name in ("fixed_shift_forward", "base2_backward"):
        monkeypatch.setattr(flash, name, looped(name))
    q, k, v = qkv(70, 90, 8, 4, 2)  # edge tiles of 6 rows and 26 keys; two runs of one k/v head
    tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = lab_flash(*tensors, causal=causal, block_q=32, block_k=32, workers=2)
    assert allocated == [(threading.get_ident(), None)] * 2  # one buffer per thread, before the loops
    assert threading.get_ident() not in {t for t, _ in looping}
    ag.sum(out).backward()
    # two runs, one a thread; a thread that has ended may hand its ident on, so count, not idents
    backward = allocated[2:]
    assert [p for _, p in backward] == ["base2_backward"] * 2 == [p for _, p in looping[2:]]
    assert threading.get_ident() not in {t for t, _ in backward}
    assert all(t._scores is None for t in used) and len({id(t) for t in used}) == 4


def test_deal_gives_threads_equal_work_heaviest_first():
    from ag.lab.sharing import deal
    assert deal(list("abcdefgh"), list(range(1, 9)), 2) == list("hgefdcab")
    assert deal(list("abc"), [5, 5, 5], 2) == list("cba")  # ties: the last first
    assert deal(list("abcdef"), [1, 9, 1, 9, 1, 9], 3) == list("fdbace")


def test_runs_hold_the_heads_that_fit_a_score_tile_and_give_every_worker_one():
    from ag.lab.sharing import SCORE_TILE_BYTES, Run, plan_runs
    tile = SCORE_TILE_BYTES
    # B = 1, H = 8: 256 x 512 float32 tiles (512 KiB a head) make runs of one head
    assert plan_runs((1,), 8, tile, 2) == [Run(None, a, a + 1) for a in range(8)]
    # 256 x 256 (256 KiB a head): two heads a run; small tiles: as many as leave every worker one
    assert plan_runs((1,), 8, tile // 2, 2) == [Run(None, a, a + 2) for a in range(0, 8, 2)]
    assert plan_runs((1,), 8, 1024, 2) == [Run(None, 0, 4), Run(None, 4, 8)]
    assert plan_runs((1,), 8, 1024, 3) == [Run(None, 0, 3), Run(None, 3, 6), Run(None, 6, 8)]
    # every batch entry in a run where they fit, else one entry a run, over the batch as well
    assert plan_runs((2,), 8, 1024, 2) == [Run(None, 0, 4), Run(None, 4, 8)]
    assert plan_runs((4,), 1, 1024, 2) == [Run((b,), 0, 1) for b in range(4)]
    assert plan_runs((2, 3), 2, tile, 2) == [Run((i, j), a, a + 1) for i in range(2) for j in range(3) for a in (0, 1)]
    assert plan_runs((), 3, 10 * tile, 4) == [Run(None, a, a + 1) for a in range(3)]  # never less than a head
    assert plan_runs((0,), 2, tile, 2) == [Run(None, 0, 1), Run(None, 1, 2)]  # an empty batch


def test_a_forwards_runs_are_cut_by_query_tile_only_where_the_heads_leave_a_worker_idle():
    from ag.lab.sharing import SCORE_TILE_BYTES, Run, plan_runs
    tiles = [(0, 32), (32, 64), (64, 96), (96, 100)]
    # one head, two workers: one run a query tile, the last first, every other round of two backwards
    assert plan_runs((1,), 1, SCORE_TILE_BYTES, 2, tiles) == [Run(None, 0, 1, tiles[t]) for t in (3, 2, 0, 1)]
    # one head of each of two batch entries, three workers: each run cut the same way
    cut = plan_runs((2,), 1, SCORE_TILE_BYTES, 3, tiles)
    assert cut == [Run((b,), 0, 1, tiles[t]) for b in (0, 1) for t in (3, 2, 1, 0)]
    # heads enough for every worker, or a single query tile: runs of heads, as without query_tiles
    assert plan_runs((1,), 8, SCORE_TILE_BYTES, 2, tiles) == plan_runs((1,), 8, SCORE_TILE_BYTES, 2)
    assert plan_runs((1,), 1, SCORE_TILE_BYTES, 2, tiles[:1]) == [Run(None, 0, 1)]
    assert plan_runs((0,), 1, SCORE_TILE_BYTES, 2, tiles) == [Run(None, 0, 1)]  # an empty batch


@pytest.mark.parametrize("tiles", [8, 9, 16, 33])
def test_query_tiles_dealt_to_two_threads_give_each_the_same_causal_work_to_within_a_tile(tiles):
    from ag.lab.sharing import Run, by_query_tile
    runs = by_query_tile([Run(None, 0, 1)], [(t, t + 1) for t in range(tiles)], workers=2)
    work = [sum(r.rows[1] for r in runs[i::2]) for i in (0, 1)]  # tile t sees t + 1 key tiles
    assert sorted(r.rows for r in runs) == [(t, t + 1) for t in range(tiles)]
    assert abs(work[0] - work[1]) <= 2 and (tiles % 4 or work[0] == work[1])
    dealt_in_order = [sum(t + 1 for t in range(i, tiles, 2)) for i in (0, 1)]  # 4 to 17 apart
    assert abs(dealt_in_order[0] - dealt_in_order[1]) >= 4


def test_a_run_of_query_rows_is_the_view_of_its_rows_in_q_o_and_l_and_not_in_k():
    from ag.lab.sharing import Run
    x = np.arange(2 * 4 * 10 * 3).reshape(2, 4, 10, 3)
    run = Run((1,), 1, 2, rows=(4, 7))
    np.testing.assert_array_equal(run.part(x, 2, queries=True), x[1, 2:4, 4:7])
    np.testing.assert_array_equal(run.part(x[..., 0], 2, axis=-2, queries=True), x[1, 2:4, 4:7, 0])
    np.testing.assert_array_equal(run.part(x), x[1, 1:2])
    assert np.shares_memory(run.part(x, 2, queries=True), x)


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("batch, h, h_kv, n_q, n_k", [((1,), 1, 1, 100, 100), ((1,), 4, 1, 70, 130), ((), 2, 2, 130, 70)])
def test_one_head_shares_its_forward_among_threads_by_query_tile_and_the_bits_do_not_change(
        monkeypatch, causal, batch, h, h_kv, n_q, n_k, threads_at_any_size):
    """Work is split over (batch, head, query tile): a call with fewer k/v heads than workers
    (one head, multi-query attention) is cut by query tile, not left on one thread."""
    pytest.importorskip("threadpoolctl", reason="workers > 1 needs the fast extra")
    workers = h_kv + 1  # more than the heads make runs
    threads, forward, all_started = set(), attention.fixed_shift_forward, threading.Barrier(workers, timeout=10)

    def spy(*args, **kwargs):
        if threading.get_ident() not in threads:
            threads.add(threading.get_ident())
            all_started.wait()  # or the first threads could take every run before the last starts
        return forward(*args, **kwargs)
    q, k, v = qkv(n_q, n_k, 8, h, h_kv, dtype=np.float32, batch=batch)
    alone = lab_flash(q, k, v, causal=causal, workers=1, block_q=32, block_k=48, return_lse=True)
    monkeypatch.setattr(flash, "fixed_shift_forward", spy)
    shared = lab_flash(q, k, v, causal=causal, workers=workers, block_q=32, block_k=48, return_lse=True)
    assert len(threads) == workers
    assert all(np.array_equal(a, b) for a, b in zip(alone, shared))
    np.testing.assert_allclose(shared[0], naive_attention(q, k, v, causal=causal), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_empty_batch_gives_empty_outputs_and_grads(workers):
    q = ag.Tensor(np.ones((0, 2, 5, 4), np.float32), requires_grad=True)
    out = lab_flash(q, q, q, workers=workers)
    ag.sum(out).backward()
    assert out.shape == (0, 2, 5, 4) and q.grad.shape == (0, 2, 5, 4)


def test_a_run_is_the_view_of_its_heads_in_every_array():
    from ag.lab.sharing import Run
    x = np.arange(2 * 3 * 8 * 5 * 4).reshape(2, 3, 8, 5, 4)
    np.testing.assert_array_equal(Run((1, 2), 1, 3).part(x, 2), x[1, 2, 2:6])
    np.testing.assert_array_equal(Run(None, 1, 3).part(x), x[:, :, 1:3])
    np.testing.assert_array_equal(Run((0, 1), 0, 2).part(x[..., 0], 4, axis=-2), x[0, 1, 0:8, :, 0])
    assert np.shares_memory(Run((1, 2), 1, 3).part(x, 2), x)


@pytest.mark.parametrize("batch, h, h_kv", [((4,), 1, 1), ((2, 3), 2, 1), ((1,), 8, 2)])
def test_the_batch_and_the_heads_are_shared_out_and_the_bits_do_not_change(monkeypatch, batch, h, h_kv, threads_at_any_size):
    pytest.importorskip("threadpoolctl", reason="workers > 1 needs the fast extra")
    from ag.lab import sharing
    threads, forward, both_started = set(), attention.fixed_shift_forward, threading.Barrier(2, timeout=10)

    def spy(*args, **kwargs):
        if threading.get_ident() not in threads:
            threads.add(threading.get_ident())
            both_started.wait()  # or the first thread could take every run before the other starts
        return forward(*args, **kwargs)
    q, k, v = qkv(80, 80, 8, h, h_kv, dtype=np.float32, batch=batch)
    alone = lab_flash(q, k, v, causal=True, workers=1, block_q=32, block_k=32)
    monkeypatch.setattr(flash, "fixed_shift_forward", spy)
    monkeypatch.setattr(sharing, "SCORE_TILE_BYTES", 32 * 32 * 4)  # a run: one head of one entry
    shared = lab_flash(q, k, v, causal=True, workers=2, block_q=32, block_k=32)
    assert len(threads) == 2
    assert np.array_equal(alone, shared)
    np.testing.assert_allclose(shared, naive_attention(q, k, v, causal=True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("workers", [1, 2])
def test_o_is_written_in_place_in_qs_memory_order_by_every_run(workers, threads_at_any_size):
    """q a view of (b, s, heads, d), as a transformer layer makes it: O comes in the same order."""
    pytest.importorskip("threadpoolctl", reason="workers > 1 needs the fast extra")
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 70, 4, 8)).astype(np.float32).transpose(0, 2, 1, 3) for _ in range(3))
    out, lse = lab_flash(q, k, v, causal=True, block_q=32, block_k=32, workers=workers, return_lse=True)
    assert np.argsort(out.strides).tolist() == np.argsort(q.strides).tolist()
    np.testing.assert_allclose(out, naive_attention(q, k, v, causal=True), rtol=1e-5, atol=1e-5)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(8) + np.triu(np.full((70, 70), -np.inf, np.float32), 1)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-5, atol=1e-5)


def test_each_thread_takes_its_own_runs_whichever_starts_first():
    """So every thread allocates its buffers, and a call's memory does not depend on the timing."""
    all_taken, taken = threading.Event(), []

    def job(own, run):
        if own == "late" and not all_taken.wait(timeout=10):  # until the other has taken its runs
            raise AssertionError("the early thread took runs that were not its own")
        taken.append((own, run))
        if len(taken) == 4:
            all_taken.set()
    from ag.lab import sharing
    runs = sharing.plan_runs((1,), 8, sharing.SCORE_TILE_BYTES, 2)
    sharing.in_turns(runs, ["late", "early"], job, hold_blas=True)
    assert sorted(taken, key=lambda t: t[1].first) == [("late" if r.first % 2 == 0 else "early", r) for r in runs]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_of_a_tile_gives_zero_not_a_subnormal_and_numpys_exp_elsewhere(dtype):
    from ag.lab.subnormals import EXP_FLOOR
    floor = EXP_FLOOR[np.dtype(dtype)]
    s = np.random.default_rng(0).uniform(floor - 30, 5, (2, 8, 64)).astype(dtype)
    s[0, 0, :4] = [-np.inf, np.nan, floor + 0.5, floor - 0.5]
    want = np.exp(s)
    assert np.any((want > 0) & (want < np.finfo(dtype).tiny))  # numpy's exp gives subnormals here
    got = LabTiles.exp(s.copy())
    below = s <= floor
    assert np.all(got[below] == 0) and below.sum() > 10
    np.testing.assert_array_equal(got[~below], want[~below])  # bit for bit, NaN included
    assert not np.any((got > 0) & (got < np.finfo(dtype).tiny))


@pytest.mark.parametrize("causal", [False, True])
def test_peaked_attention_computes_no_subnormal_probability_and_matches_naive(monkeypatch, causal):
    import types
    from ag.lab import flash_tiles as tiles_module
    q, k, v = (x.astype(np.float32) for x in qkv(96, 96, 16, 2, 2, seed=4))
    q = q * 16  # scores of standard deviation 16: e^(S - L) falls below float32's normal range
    subnormal = []

    def counted(exp):
        def spy(x, out=None):
            result = exp(x, out=out)
            subnormal.append(int(np.count_nonzero((result > 0) & (result < np.finfo(result.dtype).tiny))))
            return result
        return spy
    from ag.lab import subnormals
    for module in (tiles_module, subnormals):  # Tiles.exp is subnormals.exp_flushed
        monkeypatch.setattr(module, "np", types.SimpleNamespace(**{**vars(np), "exp": counted(np.exp),
                                                                   "exp2": counted(np.exp2)}))
    weight = np.random.default_rng(5).standard_normal(q.shape).astype(np.float32)
    out, grads = grads_of(lab_flash, q, k, v, weight, causal=causal, block_q=32, block_k=32)
    monkeypatch.undo()
    assert len(subnormal) > 10 and sum(subnormal) == 0
    out64, grads64 = grads_of(naive_attention, *(x.astype(np.float64) for x in (q, k, v)), weight, causal=causal)
    np.testing.assert_allclose(out, out64, rtol=0, atol=1e-4)
    for got, want in zip(grads, grads64):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())
