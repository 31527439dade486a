"""ag.lab's threads: with the lab on, a large op's blocks shared among threads give the same bits as one thread."""
import os
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest

import ag
from ag.lab import threads

pytestmark = pytest.mark.skipif(not threads.have_threadpoolctl(), reason="needs threadpoolctl (ag[fast])")


@pytest.fixture(autouse=True)
def lab_on():
    with ag.lab.on():
        yield


@pytest.fixture(autouse=True)
def shared_at_test_sizes(monkeypatch):
    """These tests' arrays are shared as a larger op's are: the thresholds come down to sizes they
    pass. Under test is how an op is shared, not where sharing starts to pay (that is tuned by
    the benchmarks: ``threads.MIN_PRODUCT``)."""
    monkeypatch.setattr(threads, "MIN_PRODUCT", 1 << 22)
    monkeypatch.setattr(threads, "MIN_PASS", 1 << 18)


@pytest.fixture
def workers():
    """Set the op threads for one test; the setting before it comes back after."""
    previous = threads.set_workers(None)
    yield threads.set_workers
    threads.set_workers(previous)


def each_worker_count(workers, run):
    """run() with 1, 2 and 3 op threads."""
    results = []
    for n in (1, 2, 3):
        workers(n)
        results.append(run())
    return results


def assert_same_bits(results):
    first = results[0]
    for other in results[1:]:
        for a, b in zip(first, other):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert np.array_equal(a, b, equal_nan=True), "results differ between thread counts"


def runs_shared_and_not(monkeypatch, workers, step, size, names):
    """step()'s results on 1, 2 and 3 workers, on 2 again while watching which threads ran the
    blocks named (a block is named by the function its op shares), and unshared (``MIN_PASS``
    above ``size``); and how many threads ran each named block."""
    results = each_worker_count(workers, step)
    ran_on = set()
    in_blocks = threads.in_blocks

    def watched(block, *args, **kwargs):
        def noted(start, stop):
            ran_on.add((block.__name__, threading.get_ident()))
            block(start, stop)
        in_blocks(noted, *args, **kwargs)
    monkeypatch.setattr(threads, "in_blocks", watched)
    workers(2)
    results.append(step())
    monkeypatch.setattr(threads, "in_blocks", in_blocks)
    monkeypatch.setattr(threads, "MIN_PASS", size + 1)
    results.append(step())
    return results, {name: sum(1 for n, _ in ran_on if n == name) for name in names}


def rng():
    return np.random.default_rng(0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["matrix", "transposed", "few rows", "stack", "stack @ matrix"])
def test_a_large_product_and_its_grads_are_bit_identical_for_any_number_of_workers(workers, dtype, case):
    r = rng()
    shapes = {"matrix": ((517, 300), (300, 301)), "transposed": ((300, 517), (300, 301)),
              "few rows": ((100, 600), (600, 701)),  # cut between columns
              "stack": ((3, 4, 130, 64), (3, 4, 64, 131)), "stack @ matrix": ((3, 170, 120), (120, 230))}[case]
    a0, b0 = (r.standard_normal(s).astype(dtype) for s in shapes)
    if case == "transposed":
        a0 = a0.T  # a strided view, as x.T in linear's weight grad
    assert a0.shape[-2] * a0.shape[-1] * b0.shape[-1] * int(np.prod(a0.shape[:-2])) >= threads.MIN_PRODUCT

    def step():
        a, b = ag.Tensor(a0, requires_grad=True), ag.Tensor(b0, requires_grad=True)
        out = ag.matmul(a, b)
        ag.sum(ag.mul(out, out)).backward()
        return out.value, a.grad, b.grad
    results = each_worker_count(workers, step)
    assert_same_bits(results)
    want = np.matmul(a0, b0)  # to rounding: BLAS's sums may run in another order
    np.testing.assert_allclose(results[0][0], want, rtol=0, atol=(1e-5 if dtype == np.float32 else 1e-13) * np.abs(want).max())


def test_linear_on_activations_is_bit_identical_for_any_number_of_workers(workers):
    r = rng()
    x0 = r.standard_normal((64, 8, 256)).astype(np.float32)
    w0, b0 = r.standard_normal((256, 384)).astype(np.float32), r.standard_normal(384).astype(np.float32)

    def step():
        x, w, b = (ag.Tensor(v, requires_grad=True) for v in (x0, w0, b0))
        out = ag.linear(x, w, b)
        ag.sum(ag.mul(out, out)).backward()
        return out.value, x.grad, w.grad, b.grad
    assert_same_bits(each_worker_count(workers, step))


@pytest.mark.parametrize("causal", [False, True])
def test_scaled_masked_softmax_and_its_grad_are_bit_identical_for_any_number_of_workers(workers, causal):
    r = rng()
    s0 = r.standard_normal((3, 5, 130, 140)).astype(np.float32) * 4
    dy = r.standard_normal(s0.shape).astype(np.float32)
    assert s0.size >= threads.MIN_PASS

    def step():
        s = ag.Tensor(s0, requires_grad=True)
        y = ag.scaled_masked_softmax(s, 0.125, causal)
        ag.sum(ag.mul(y, ag.Tensor(dy))).backward()
        return y.value, s.grad
    results = each_worker_count(workers, step)
    assert_same_bits(results)
    y = results[0][0]
    np.testing.assert_allclose(y.sum(axis=-1), 1, rtol=1e-5)
    if causal:
        assert np.all(np.triu(y[0, 0], 1) == 0)


@pytest.mark.parametrize("op", [ag.gelu, ag.relu])
def test_gelu_relu_and_their_grads_are_bit_identical_for_any_number_of_workers(workers, op):
    r = rng()
    x0 = r.standard_normal((64, 8, 1024)).astype(np.float32) * 3
    dy = r.standard_normal(x0.shape).astype(np.float32)

    def step():
        x = ag.Tensor(x0, requires_grad=True)
        y = op(x)
        ag.sum(ag.mul(y, ag.Tensor(dy))).backward()
        return y.value, x.grad
    assert_same_bits(each_worker_count(workers, step))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_layer_norm_and_its_grads_are_bit_identical_for_any_number_of_workers_and_unshared(workers, dtype,
                                                                                          monkeypatch):
    """Shared out by rows or not, the same roundings: rows on 1, 2 and 3 threads, and the whole op as one
    pass below the threshold, give the same y, dx, dγ and dβ to the bit."""
    r = rng()
    x0 = (r.standard_normal((64, 8, 600)) * 3 + 1).astype(dtype)
    g0, b0 = (r.standard_normal(600).astype(dtype) for _ in range(2))
    dy = r.standard_normal(x0.shape).astype(dtype)
    assert x0.size >= threads.MIN_PASS

    def step():
        x, g, b = (ag.Tensor(a, requires_grad=True) for a in (x0, g0, b0))
        y = ag.layer_norm(x, g, b)
        ag.sum(ag.mul(y, ag.Tensor(dy))).backward()
        return y.value, x.grad, g.grad, b.grad
    results, shared = runs_shared_and_not(monkeypatch, workers, step, x0.size, ("layer_norm", "layer_norm_grad"))
    assert shared == {"layer_norm": 2, "layer_norm_grad": 2}, "layer_norm's rows were not shared among 2 threads"
    assert_same_bits(results)
    assert results[0][1].dtype == dtype and np.isfinite(results[0][1]).all()


def test_dropout_its_mask_and_grad_are_bit_identical_for_any_number_of_workers_and_unshared(workers,
                                                                                        monkeypatch):
    """The mask's chunks, each from its own generator, and the backward's passes, shared on 1, 2 and 3
    threads or not at all, give the same mask, y and dx to the bit."""
    from ag.ops import fused
    monkeypatch.setattr(fused, "MASK_CHUNK", 10007)  # many chunks, each an odd count of 32-bit draws
    r = rng()
    x0 = r.standard_normal((64, 8, 600)).astype(np.float32)
    dy = r.standard_normal(x0.shape).astype(np.float32)
    assert x0.size >= threads.MIN_PASS

    def step():
        x = ag.Tensor(x0, requires_grad=True)
        y = ag.dropout(x, 0.25, np.random.default_rng(7))
        ag.sum(ag.mul(y, ag.Tensor(dy))).backward()
        return y.value, x.grad, fused.keep_mask(np.random.default_rng(8), x0.shape, 0.25)
    results, shared = runs_shared_and_not(monkeypatch, workers, step, x0.size, ("chunks_of", "<lambda>"))
    assert shared == {"chunks_of": 2, "<lambda>": 2}, "the mask's chunks or the backward's passes ran on one thread"
    assert_same_bits(results)
    y, dx, _ = results[0]
    kept = y != 0
    np.testing.assert_array_equal(y, np.where(kept, x0 * np.float32(1 / 0.75), 0))
    np.testing.assert_array_equal(dx, np.where(kept, dy * np.float32(1 / 0.75), 0))


def test_a_transformer_step_is_bit_identical_for_any_number_of_workers(workers):
    x0 = rng().standard_normal((128, 4, 256)).astype(np.float32)

    def step():
        model = ag.nn.Transformer(2, 256, 4, dropout=0.0, seed=1)
        x = ag.Tensor(x0, requires_grad=True)
        out = model(x)
        ag.sum(ag.mul(out, out)).backward()
        return [out.value, x.grad] + [p.grad for p in model.parameters()]
    assert_same_bits(each_worker_count(workers, step))


def test_the_blocks_cover_every_item_once_on_as_many_threads_as_workers(workers):
    workers(3)
    seen, lock = [], threading.Lock()

    def block(start, stop):
        with lock:
            seen.append((start, stop, threading.get_ident()))
    threads.in_blocks(block, 10, threads.MIN_PASS, threads.MIN_PASS)
    assert sorted((a, b) for a, b, _ in seen) == [(0, 3), (3, 6), (6, 10)]
    assert len({t for _, _, t in seen}) == 3
    assert (0, 3, threading.get_ident()) in seen  # the caller takes the first block


def test_a_small_op_stays_on_the_callers_thread(workers):
    workers(2)
    seen = []
    threads.in_blocks(lambda a, b: seen.append((a, b, threading.get_ident())), 10, threads.MIN_PASS - 1,
                      threads.MIN_PASS)
    assert seen == [(0, 10, threading.get_ident())]


def test_a_product_is_shared_from_min_product_multiply_adds_and_one_below_is_one_blas_call(workers, monkeypatch):
    monkeypatch.undo()  # the real thresholds
    workers(2)
    shared = []
    real_in_blocks = threads.in_blocks
    monkeypatch.setattr(threads, "in_blocks", lambda *a, **k: shared.append(a[2]) or real_in_blocks(*a, **k))
    k, n = 512, 256
    rows = threads.MIN_PRODUCT // (k * n)
    y = np.ones((k, n), np.float32)
    for m in (rows - 1, rows):
        out = ag.matmul(ag.Tensor(np.ones((m, k), np.float32)), ag.Tensor(y)).value
        assert out.shape == (m, n) and np.all(out == k)
    assert shared == [rows * k * n] == [threads.MIN_PRODUCT]


def test_blas_is_held_to_one_thread_inside_product_blocks_and_given_back_after(workers):
    workers(2)
    blas = [c for c in threads.blas_threads().lib_controllers if c.user_api == "blas"]
    before = [c.num_threads for c in blas]
    inside = []

    def block(start, stop):
        inside.append([c.num_threads for c in blas])
    threads.in_blocks(block, 2, threads.MIN_PRODUCT, threads.MIN_PRODUCT, blas=True)
    assert inside and all(n == 1 for counts in inside for n in counts)
    assert [c.num_threads for c in blas] == before


def test_an_error_in_another_threads_block_is_raised_on_the_caller_and_the_pool_still_works(workers):
    workers(2)

    def block(start, stop):
        if start > 0:
            raise ValueError(f"block {start}..{stop} failed")
    with pytest.raises(ValueError, match="block 5..10 failed"):
        threads.in_blocks(block, 10, threads.MIN_PASS, threads.MIN_PASS)
    done = []
    threads.in_blocks(lambda a, b: done.append((a, b)), 10, threads.MIN_PASS, threads.MIN_PASS)
    assert sorted(done) == [(0, 5), (5, 10)]


def test_no_thread_keeps_an_ops_arrays_alive_after_it_returns(workers):
    workers(2)
    a = np.ones((600, 200), np.float32)
    b = np.ones((200, 600), np.float32)
    out = ag.matmul(ag.Tensor(a), ag.Tensor(b)).value
    refs = [weakref.ref(x) for x in (a, b, out)]
    del a, b, out
    assert [r() for r in refs] == [None, None, None]


def test_set_workers_refuses_what_is_not_a_positive_count(workers):
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="set_workers: workers must be a positive integer or None"):
            threads.set_workers(bad)


def test_without_threadpoolctl_ops_run_on_one_thread(workers, monkeypatch):
    workers(4)
    monkeypatch.setattr(threads, "have_threadpoolctl", lambda: False)
    assert threads.workers() == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_shares_large_ops_among_its_own_threads(workers):
    workers(2)
    a = np.ones((600, 200), np.float32)
    ag.matmul(a, a.T)  # the parent's pool is running now
    pid = os.fork()
    if pid == 0:
        try:
            out = ag.matmul(ag.Tensor(a), ag.Tensor(a.T)).value
            os._exit(0 if float(out[0, 0]) == 200.0 else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_an_op_from_another_thread_while_the_pool_is_busy_runs_alone_and_blas_comes_back(workers):
    workers(2)
    blas = [c for c in threads.blas_threads().lib_controllers if c.user_api == "blas"]
    before = [c.num_threads for c in blas]
    busy, go = threading.Event(), threading.Event()

    def slow(start, stop):
        busy.set()
        go.wait(10)
    first = threading.Thread(target=threads.in_blocks, args=(slow, 2, threads.MIN_PRODUCT, threads.MIN_PRODUCT),
                             kwargs={"blas": True})
    first.start()
    assert busy.wait(10)
    seen = []
    threads.in_blocks(lambda a, b: seen.append((a, b, threading.get_ident())), 10, threads.MIN_PRODUCT,
                      threads.MIN_PRODUCT, blas=True)
    go.set()
    first.join(10)
    assert seen == [(0, 10, threading.get_ident())]
    assert [c.num_threads for c in blas] == before


def test_where_no_thread_may_start_the_caller_does_the_whole_op(workers, monkeypatch):
    workers(4)
    monkeypatch.setattr(threads, "_pool", threads._Pool())

    def refuse(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", refuse)
    seen = []
    threads.in_blocks(lambda a, b: seen.append((a, b, threading.get_ident())), 10, threads.MIN_PASS,
                      threads.MIN_PASS)
    assert seen == [(0, 10, threading.get_ident())]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_the_default_is_the_cores_this_process_may_run_on_not_the_machines():
    """Under ``taskset`` or a job's cpuset os.cpu_count() still counts the whole machine: pinned to one
    core, a process must share nothing, in large ops and in flash_attention alike."""
    pytest.importorskip("threadpoolctl")
    child = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from ag.lab import products, sharing, threads\n"
        "print(os.cpu_count(), threads.cores(), threads.workers(), sharing.count(None), products.STEPS)\n")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout.split()
    machine, cores, op_workers, attention_workers, steps = map(int, out)
    assert (cores, op_workers, attention_workers, steps) == (1, 1, 1, 2), f"os.cpu_count() = {machine}: {out}"
    assert threads.cores() == len(os.sched_getaffinity(0))
