"""The lab's threads: one large op's NumPy work shared among them, block by block.

NumPy's BLAS shares a product among its own threads, but every other pass (exp, tanh, a
softmax's max and sum) runs on one core. Sharing those passes among Python threads alone did not
pay: OpenBLAS's idle threads spin for a while after each product, so a pass started just after
one found the second core taken (docs/lab.md). So a large op shares both: its output is cut into
blocks along a leading axis, the blocks are dealt to ``workers`` threads (the caller takes the
first), and a product's blocks run with BLAS held to one thread, which leaves OpenBLAS's own
threads asleep. A smaller product stays one BLAS call on BLAS's own threads, and a smaller pass on
the caller's thread: handing them over costs more than it saves.

Each block is computed by the same NumPy calls whichever thread takes it: a pass's rows and
elements do not depend on each other, and a product is computed in steps whose size depends on
its shape alone, one BLAS call each on one BLAS thread (``products.ProductBlocks``), also with one
worker. So results are bit-identical for any number of workers (``tests/test_lab_threads.py``).
Every array an op returns or keeps is still allocated once, by the caller, so ``ag.trace`` sees
the same buffers; the pool's threads, started at the first large op, keep none of them.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import queue
import threading
from typing import Callable

import numpy as np

# Below these sizes the op stays on the caller's thread, and a product on BLAS's own threads:
# waking a kept thread costs more than it saves there (docs/lab.md, "Threads").
MIN_PRODUCT = 1 << 27  # multiply-adds of a product: (1024 × 512) @ (512 × 256)
MIN_PASS = 1 << 19  # elements of an elementwise or row-wise pass (2 MB of float32)

_workers: int | None = None  # None: the cores this process may run on, when threadpoolctl can hold BLAS


def cores() -> int:
    """The cores this process may run on: its CPU affinity where the system has one (``taskset``,
    a container's or a batch job's cpuset), else all the machine's. ``os.cpu_count()`` counts the
    machine's even then, and 16 threads on the 2 cores a job was given slow every op they share."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def set_workers(workers: int | None) -> int | None:
    """The threads a large op may use: a positive int, or None for the cores this process may run on
    (``cores()``; 1 without threadpoolctl, ``pip install 'ag[fast]'``). Returns the setting it replaces."""
    global _workers
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise ValueError(f"set_workers: workers must be a positive integer or None, got {workers!r}")
    previous, _workers = _workers, workers
    return previous


def workers() -> int:
    """The threads a large op uses now: ``set_workers``'s, or ``cores()``."""
    asked = _workers if _workers is not None else cores()
    return asked if asked == 1 or have_threadpoolctl() else 1


@functools.cache
def have_threadpoolctl() -> bool:
    return importlib.util.find_spec("threadpoolctl") is not None


@functools.cache
def blas_threads():
    """threadpoolctl's view of the BLAS libraries loaded now (NumPy's among them), made once:
    ``threadpool_limits`` reads /proc's memory map on every call."""
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController()


class _Pool:
    """Threads that wait for blocks: each has its own queue, and reports each block done or failed
    on the queue the op gave with it (an op interrupted while it waited leaves no report behind
    for the next one)."""

    def __init__(self) -> None:
        self.jobs: list[queue.SimpleQueue] = []
        self.lock = threading.Lock()  # one op at a time shares the pool; another runs on its own thread

    def grow(self, threads: int) -> int:
        """Start threads up to ``threads``; returns how many there are. Where no more may start (a
        grading sandbox caps a process's threads), the ones there are do the work."""
        while len(self.jobs) < threads:
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            try:
                threading.Thread(target=self._serve, args=(jobs,), name="ag-op", daemon=True).start()
            except RuntimeError:  # "can't start new thread"
                break
            self.jobs.append(jobs)
        return len(self.jobs)

    def _serve(self, jobs: queue.SimpleQueue) -> None:
        while True:
            block, start, stop, done = jobs.get()
            result = None
            try:
                block(start, stop)
            except BaseException as error:  # noqa: BLE001 -- re-raised on the caller's thread
                result = error
            block = None  # before reporting: the op's arrays must not outlive it here (ag.trace counts them)
            done.put(result)


_pool = _Pool()


def _forget_pool_in_child() -> None:
    """A forked child has none of the parent's threads: it starts its own pool when it needs one."""
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_forget_pool_in_child)


def cuts(n: int, parts: int, align: int = 1) -> list[int]:
    """0 = c_0 ≤ c_1 ≤ … ≤ c_parts = n: n items in ``parts`` blocks, every inner cut a multiple of
    ``align``: the ⌈n / align⌉ steps of ``align`` items dealt as evenly as they go."""
    steps = -(-n // align)
    return [min(n, steps * i // parts * align) for i in range(parts)] + [n]


def in_blocks(block: Callable[[int, int], None], n: int, size: int, minimum: int, blas: bool = False,
              align: int = 1) -> None:
    """``block(start, stop)`` over items 0..n-1 of an op of ``size`` (elements or multiply-adds):
    on the caller's thread alone below ``minimum`` or with one worker, else in one block per
    worker, cut at multiples of ``align``. With ``blas`` (the blocks call products) BLAS is held
    to one thread whenever threadpoolctl is there, one worker or more, so that a product's bits
    do not depend on how many threads BLAS or ag gives it. One op at a time holds the pool and
    BLAS's setting: an op that comes from another thread meanwhile runs alone on its own thread."""
    hold = blas and size >= minimum and have_threadpoolctl()
    threads = min(workers(), n) if size >= minimum else 1
    if (threads < 2 and not hold) or not _pool.lock.acquire(blocking=False):
        block(0, n)
        return
    errors: list[BaseException] = []
    try:
        with blas_threads().limit(limits=1, user_api="blas") if hold else contextlib.nullcontext():
            threads = min(threads, 1 + _pool.grow(threads - 1))
            if threads < 2:
                block(0, n)
                return
            edges = cuts(n, threads, align)
            done: queue.SimpleQueue = queue.SimpleQueue()
            for jobs, start, stop in zip(_pool.jobs, edges[1:-1], edges[2:]):
                jobs.put((block, start, stop, done))
            try:
                block(edges[0], edges[1])
            except BaseException as error:  # noqa: BLE001 -- the others must finish before it is raised
                errors.append(error)
            errors += [e for e in (done.get() for _ in range(threads - 1)) if e is not None]
    finally:
        _pool.lock.release()
    if errors:
        raise errors[0]


def shareable(*arrays) -> bool:
    """Whether a pass over these arrays is cut into blocks: they are large (``MIN_PASS`` elements,
    tested first, as the cheapest), of one shape, and C-contiguous NumPy arrays (so their flat and
    row views are views)."""
    first = arrays[0]
    return first.size >= MIN_PASS and all(type(x) is np.ndarray and x.flags.c_contiguous
                                          and x.shape == first.shape for x in arrays)


def elementwise(passes: Callable[..., None], *arrays) -> None:
    """``passes(*arrays)``, in blocks of elements on ag's op threads when they are ``shareable``."""
    if not shareable(*arrays):
        passes(*arrays)
        return
    first = arrays[0]
    flat = [x.reshape(-1) for x in arrays]
    in_blocks(lambda start, stop: passes(*(f[start:stop] for f in flat)), first.size, first.size, MIN_PASS)
