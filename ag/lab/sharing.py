"""One ``flash_attention`` call shared among threads on NumPy.

The call is cut into runs, each one tiled loop (``tiled_forward`` or ``tiled_backward``) over some
key/value heads with their query groups: of every batch entry at once when they fit, else of one.
A run holds as many heads as keep its score tile S_ij within ``SCORE_TILE_BYTES``, so that a
step's S_ij, K_j, V_j and acc stay in a 1 MB L2 cache, and there are at least as many runs as
workers where the heads allow it. Where they do not (one head, or fewer heads than workers), a
forward's runs are cut by query tile as well: a tile's rows of O and L depend on no other query.
A backward's are not: every query tile adds into the same dK and dV, and a dK and dV of its own
for each group of query tiles would cost more memory than the threads save (docs/lab.md).
``workers`` threads take the runs in turn, each with its own tiles, and BLAS held to one thread
each (threadpoolctl), so nothing oversubscribes. Runs are independent and each is computed the
same way whichever thread takes it, so the result is bit-identical for any number of workers.
"""
from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..attention.flash import one_blas_thread
from .threads import blas_threads, cores, have_threadpoolctl

# A run's score tiles stay in a core's cache: one head's forward a run; the backward's 256 × 256 tiles make runs of two.
SCORE_TILE_BYTES = 512 * 1024
# A thread is started only for this many multiply-adds of QKᵀ (a 256 × 256 tile at d = 64): below
# it, starting threads costs more than they save.
MIN_PRODUCTS_PER_THREAD = 1 << 22


@dataclass(frozen=True)
class Run:
    """Key/value heads [first, stop) of batch entry ``index`` (None: of every batch entry), and of
    their queries the rows [start, stop) of one tile (a forward's; None: every query)."""

    index: tuple[int, ...] | None
    first: int
    stop: int
    rows: tuple[int, int] | None = None

    def part(self, x: np.ndarray, per_kv_head: int = 1, axis: int = -3, queries: bool = False) -> np.ndarray:
        """This run's view of ``x``: its heads along ``axis``, ``per_kv_head`` of them for each
        key/value head (a query group for q, O and dO; 1 for k and v); with ``queries``, only its
        ``rows`` along the axis after the heads (q, O and L have one row a query, k and v none)."""
        if self.index is not None:
            x = x[self.index]
        heads = slice(self.first * per_kv_head, self.stop * per_kv_head)
        rows = slice(*self.rows) if queries and self.rows is not None else slice(None)
        return x[(Ellipsis, heads, rows) + (slice(None),) * (-axis - 2)]

    @property
    def heads(self) -> int:
        return self.stop - self.first


def plan_runs(lead: tuple[int, ...], h_kv: int, head_bytes: int, workers: int,
              query_tiles: list[tuple[int, int]] | None = None) -> list[Run]:
    """The runs of a call with batch dimensions ``lead`` and ``h_kv`` key/value heads, where one
    key/value head of one batch entry makes an S_ij of ``head_bytes``. ``query_tiles`` (a forward's
    [start, stop) rows of each tile): where the heads make fewer runs than ``workers``, each run
    is cut into one run a query tile (``by_query_tile``)."""
    entries = math.prod(lead)
    fit = max(1, SCORE_TILE_BYTES // max(head_bytes, 1))  # heads of one entry that one run may hold
    share = -(-h_kv // workers)  # at most this many heads a run, so that every worker gets one
    if entries <= 1 or (fit >= entries and h_kv >= workers):  # an empty batch: one run that does nothing
        per_run = max(1, min(fit // max(entries, 1), share))
        runs = [Run(None, a, min(a + per_run, h_kv)) for a in range(0, h_kv, per_run)]
    else:
        per_run = max(1, min(fit, h_kv, -(-h_kv * entries // workers)))
        runs = [Run(index, a, min(a + per_run, h_kv)) for index in np.ndindex(*lead) for a in range(0, h_kv, per_run)]
    if query_tiles and len(query_tiles) > 1 and len(runs) < workers and entries > 0:
        return by_query_tile(runs, query_tiles, workers)
    return runs


def runs_of(tiles, dtype, workers: int, by_query_tile: bool = False) -> list[Run]:
    """The runs of a call tiled as ``tiles`` (``attention.tiles.Tiles``: its heads and tile sizes),
    with score tiles of ``dtype`` (``plan_runs``). ``by_query_tile`` (a forward): where the heads
    leave a worker idle, runs are cut by the call's own query tiles."""
    h = tiles.heads
    head_bytes = h.group * min(tiles.block_q, h.n_q) * min(tiles.block_k, h.n_k) * np.dtype(dtype).itemsize
    query_tiles = [(a, min(a + tiles.block_q, h.n_q)) for a in range(0, h.n_q, tiles.block_q)] if by_query_tile else None
    return plan_runs(h.lead, h.h_kv, head_bytes, workers, query_tiles)


def by_query_tile(runs: list[Run], query_tiles: list[tuple[int, int]], workers: int) -> list[Run]:
    """Each run cut into one run a query tile, dealt so that ``workers`` threads get equal work
    (``deal``; under a causal mask a tile's work grows with its row)."""
    dealt = deal(query_tiles, list(range(1, len(query_tiles) + 1)), workers)
    return [replace(run, rows=rows) for run in runs for rows in dealt]


def deal(items: list, work: list[int], workers: int) -> list:
    """``items`` in an order that gives ``workers`` threads equal work, where thread i takes items
    i, i + T, … (``in_turns``): heaviest first, in rounds of T, every other round backwards. With
    T = 2 and the causal query tiles 0..7 (work 1..8), thread 0 takes tiles 7, 4, 3, 0 and thread 1
    tiles 6, 5, 2, 1, 18 key tiles each; in order, thread 1 would take 1/T of a tile more each round
    (at 16 tiles, 72 key tiles against 64)."""
    heaviest = [items[i] for i in sorted(range(len(items)), key=lambda i: (-work[i], -i))]
    order = []
    for start in range(0, len(heaviest), workers):
        round_ = heaviest[start:start + workers]
        order += round_[::-1] if (start // workers) % 2 else round_
    return order


def threads_for(products: int, workers: int) -> int:
    """The threads a call of ``products`` multiply-adds in QKᵀ takes: ``workers`` at most, each with
    ``MIN_PRODUCTS_PER_THREAD``, and at least one."""
    return max(1, min(workers, products // MIN_PRODUCTS_PER_THREAD))


def in_turns(runs: list[Run], own: list, job: Callable[[object, Run], None], hold_blas: bool) -> None:
    """``job(own[i], run)`` for every run: thread i takes runs i, i + T, i + 2T, … of T threads.
    The first error stops the others taking more and is raised here, once every thread is done.

    Each thread's runs are fixed, not taken as threads come free, so that every thread allocates
    its buffers whichever starts first: a call's memory does not depend on the threads' timing
    (``ag.remat`` measures an op's workspace once and plans with it). With one ``own`` the caller
    runs them all, with BLAS held to one thread if ``hold_blas`` (a call too small to share among
    the workers asked for: OpenBLAS's own threads, woken for each small product, cost more).
    Otherwise every run is on a new thread and the caller waits, which frees its core for them:
    a thread started beside a busy caller can wait for the idle core."""
    failed: list[BaseException] = []

    def take_runs(mine, first: int) -> None:
        for run in runs[first::len(own)]:
            if failed:
                return
            try:
                job(mine, run)
            except BaseException as error:  # noqa: BLE001 -- re-raised on the caller's thread
                failed.append(error)
    hold = hold_blas or len(own) > 1
    with blas_threads().limit(limits=1, user_api="blas") if hold else contextlib.nullcontext():
        if len(own) == 1:
            take_runs(own[0], 0)
        else:
            workers = [threading.Thread(target=take_runs, args=(mine, i), name="ag-attention")
                       for i, mine in enumerate(own)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
    if failed:
        raise failed[0]


def on_threads(items: list, threads: int, job: Callable[[object], None]) -> None:
    """``job(item)`` for every item on ``threads`` threads at most, taken in turns (``in_turns``), BLAS
    held to one thread (``one_blas_thread``: with or without threadpoolctl)."""
    with one_blas_thread():
        in_turns(items, [None] * max(1, min(threads, len(items))), lambda _, item: job(item), hold_blas=False)


def count(workers) -> int:
    """The threads a call may use: ``workers``, None meaning the cores this process may run on; 1 without
    threadpoolctl, as threads without a cap on BLAS's own would oversubscribe."""
    if workers is None:
        workers = cores()
    if not isinstance(workers, (int, np.integer)) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"flash_attention: workers must be a positive integer or None, got {workers!r}")
    if workers > 1 and not have_threadpoolctl():
        return 1
    return int(workers)
