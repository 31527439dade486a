"""Memory tracing with tracemalloc, as in the lecture.

NumPy reports every data buffer it allocates to tracemalloc in its own domain,
``np.lib.tracemalloc_domain``; ``snapshot_trace`` sums exactly those buffers, so
``allocated_bytes`` is what your arrays hold, not what Python objects cost.
``peak_bytes`` is tracemalloc's traced peak: it counts *all* Python allocations
(of which NumPy's buffers dominate in any run worth measuring) and it catches the
high-water mark between snapshots too.

Typical use, the slide's code::

    start_trace()
    a = 1.0 * np.zeros((1000, 1000)); b = a * a; c = np.sum(b, axis=1)
    print_trace_stats(snapshot_trace())   # memory allocated: 16 MB
    end_trace()

tracemalloc sees host memory only: it cannot see GPU memory. ``start_trace(device="gpu")``
traces CuPy arrays instead, with the same API: ``allocated_bytes`` is what CuPy's memory
pool has handed out since the start (``used_bytes()``, the arrays alive), and ``peak_bytes``
its high-water mark, kept by a CuPy memory hook that looks after every allocation.
"""
from __future__ import annotations

import contextlib
import tracemalloc
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

NUMPY_DOMAIN = np.lib.tracemalloc_domain
MB = 10**6


class TraceError(RuntimeError):
    """Tracing was started twice, or ended without being started."""


CATEGORIES = ("inputs", "parameters", "activations kept", "activations recomputed", "gradients")


@dataclass(frozen=True)
class Snapshot:
    """Bytes alive at one moment of a trace, with a label saying what just ran.

    In a ``tracing()`` timeline, ``categories`` is ag's own count of the same moment: the
    bytes held by tensors made (or given a grad) inside the trace, by CATEGORIES.
    """

    allocated_bytes: int
    peak_bytes: int
    op: str | None = None
    phase: str | None = None
    tensor: str | None = None
    categories: dict | None = None

    @property
    def allocated_mb(self) -> int:
        return self.allocated_bytes // MB

    @property
    def label(self) -> str:
        parts = [p for p in (self.phase, self.op, self.tensor) if p]
        return " ".join(parts)


@dataclass
class _Session:
    owns_tracemalloc: bool
    traced_at_start: int
    baseline: Counter = field(default_factory=Counter)
    pool: object | None = None  # tracing a GPU: the array module's memory pool
    peak: object | None = None  # and the hook that keeps its high-water mark


class _DevicePeak:
    """The pool's high-water mark: sampled at every snapshot, and after every allocation when
    the array module has CuPy's memory hooks."""

    def __init__(self, xp, pool) -> None:
        self.pool, self.bytes, self.hook = pool, pool.used_bytes(), None
        hooks = getattr(getattr(xp, "cuda", None), "memory_hook", None)
        if hooks is not None:
            peak = self

            class _Hook(hooks.MemoryHook):
                name = "ag.trace"

                def malloc_postprocess(self, *args, **kwargs) -> None:
                    peak.sample()
            self.hook = _Hook()
            self.hook.__enter__()

    def sample(self) -> int:
        self.bytes = max(self.bytes, self.pool.used_bytes())
        return self.bytes

    def close(self) -> None:
        if self.hook is not None:
            self.hook.__exit__(None, None, None)


def _device_module(device):
    """"gpu" means CuPy; a module with ``get_default_memory_pool`` (CuPy, or a test double) is used as given."""
    if hasattr(device, "get_default_memory_pool"):
        return device
    if device != "gpu":
        raise ValueError(f"start_trace: device must be 'cpu', 'gpu' or an array module, got {device!r}")
    try:
        import cupy
    except ImportError:
        raise TraceError("start_trace(device='gpu') needs CuPy (pip install 'ag[gpu]') and a GPU") from None
    return cupy


_session: _Session | None = None
_timelines: list[list[Snapshot]] = []


def is_tracing() -> bool:
    return _session is not None


def start_trace(device="cpu") -> None:
    """Start counting NumPy allocations (and reset the peak) from now on; ``device="gpu"``
    counts CuPy's memory pool instead (tracemalloc cannot see GPU memory)."""
    global _session
    if _session is not None:
        raise TraceError("start_trace: tracing is already running; call end_trace() first")
    if device != "cpu":
        xp = _device_module(device)
        pool = xp.get_default_memory_pool()
        _session = _Session(False, pool.used_bytes(), pool=pool, peak=_DevicePeak(xp, pool))
        return
    if tracemalloc.is_tracing():
        # A session the user started: leave its traces alone, remember what was alive.
        _session = _Session(False, 0, _numpy_traces())
        tracemalloc.reset_peak()
    else:
        tracemalloc.start(1)
        _session = _Session(True, 0)
    _session.traced_at_start = tracemalloc.get_traced_memory()[0]


def end_trace() -> None:
    """Stop tracing; a tracemalloc session the user started keeps running."""
    global _session
    if _session is None:
        raise TraceError("end_trace: tracing is not running; call start_trace() first")
    if _session.owns_tracemalloc:
        tracemalloc.stop()
    if _session.peak is not None:
        _session.peak.close()
    _session = None


def snapshot_trace(op: str | None = None, phase: str | None = None, tensor: str | None = None) -> Snapshot:
    """NumPy bytes alive now that were allocated since start_trace, and the peak so far."""
    if _session is None:
        raise TraceError("snapshot_trace: tracing is not running; call start_trace() first")
    if _session.pool is not None:
        start = _session.traced_at_start
        return Snapshot(_session.pool.used_bytes() - start, _session.peak.sample() - start, op, phase, tensor)
    traces = _numpy_traces()
    if _session.baseline:
        traces = traces - _session.baseline
    allocated = sum(size * count for (size, _), count in traces.items())
    peak = tracemalloc.get_traced_memory()[1] - _session.traced_at_start
    return Snapshot(allocated, max(peak, allocated), op, phase, tensor)


def print_trace_stats(stats: Snapshot) -> None:
    """Print ``memory allocated: N MB`` with N = allocated bytes // 10**6, as the slides do."""
    print(f"memory allocated: {stats.allocated_bytes // MB} MB")


@contextlib.contextmanager
def tracing(device="cpu") -> Iterator[list[Snapshot]]:
    """Trace a block and record a labelled snapshot after every op and every backward step
    (``device`` as in ``start_trace``).

    >>> with tracing() as timeline:
    ...     loss = ag.sum(ag.relu(x @ w)); loss.backward()
    >>> [s.label for s in timeline]   # ['forward matmul', 'forward relu', ..., 'backward matmul']
    """
    start_trace(device)
    timeline: list[Snapshot] = []
    _timelines.append(timeline)
    try:
        yield timeline
    finally:
        _timelines[:] = [t for t in _timelines if t is not timeline]  # by identity, not ==
        if not _timelines:
            _made.clear()
            _graded.clear()
        end_trace()


def record(phase: str, op: str, tensor: str | None) -> None:
    """Called by the engine after each op and backward step; a no-op unless a timeline is open."""
    if _timelines:
        snap = snapshot_trace(op, phase, tensor)
        snap = Snapshot(**{**snap.__dict__, "categories": _categories()})
        for timeline in _timelines:
            timeline.append(snap)


_made: weakref.WeakSet = weakref.WeakSet()       # tensors made inside an open timeline
_graded: weakref.WeakSet = weakref.WeakSet()     # tensors given a grad inside it


def watch_value(tensor) -> None:
    """Called by the engine for every Tensor it makes: counted by category while a timeline is open."""
    if _timelines:
        _made.add(tensor)


def watch_grad(tensor) -> None:
    """Called by the engine when a grad buffer is allocated."""
    if _timelines:
        _graded.add(tensor)


def _categories() -> dict[str, int]:
    """Live bytes by category, each buffer once (views and handed-on grads share memory)."""
    totals = dict.fromkeys(CATEGORIES, 0)
    seen: set[int] = set()

    def count(array, category: str) -> None:
        while array is not None and array.base is not None:
            array = array.base
        if array is not None and id(array) not in seen:
            seen.add(id(array))
            totals[category] += array.nbytes
    for t in list(_made):
        count(t.value, _value_category(t))
    for t in list(_graded):
        count(t.grad, "gradients")
    return totals


def _value_category(t) -> str:
    if t.op is None:
        return "parameters" if t.requires_grad else "inputs"
    return "activations recomputed" if t.rematerializer is not None else "activations kept"


@dataclass(eq=False)
class OpCounts:
    """Matrix products counted by phase: "forward", "recompute" (inside rematerializers), "backward"."""

    matmuls: Counter = field(default_factory=Counter)
    flops: Counter = field(default_factory=Counter)

    @property
    def total_matmuls(self) -> int:
        return sum(self.matmuls.values())

    def __str__(self) -> str:
        phases = ("forward", "recompute", "backward")
        parts = ", ".join(f"{p} {self.matmuls[p]}" for p in phases)
        return f"matmuls: {parts} (total {self.total_matmuls}); FLOPs: {sum(self.flops.values()):,}"


_counters: list[OpCounts] = []


@contextlib.contextmanager
def count_ops() -> Iterator[OpCounts]:
    """Count every matrix product (2·m·n·k FLOPs each) run inside the block, by phase.

    Only products count: elementwise ops are O(size) and vanish next to them.
    """
    counts = OpCounts()
    _counters.append(counts)
    try:
        yield counts
    finally:
        _counters[:] = [c for c in _counters if c is not counts]


def count_matmul(phase: str, flops: int) -> None:
    """Called by the ops for every matrix product; a no-op unless ``count_ops`` is open."""
    for counts in _counters:
        counts.matmuls[phase] += 1
        counts.flops[phase] += flops


def _numpy_traces() -> Counter:
    snapshot = tracemalloc.take_snapshot()
    return Counter((t.size, t.traceback) for t in snapshot.traces if t.domain == NUMPY_DOMAIN)
