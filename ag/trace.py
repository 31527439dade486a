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
import itertools
import time
import tracemalloc
import weakref
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterator

import numpy as np

from . import hooks
from .export import export_perfetto, export_torch_snapshot  # noqa: F401  (ag.trace.export_*)
from .modes import watching

if TYPE_CHECKING:  # trace observes the engine's events; it names Tensor only for the type checker
    from .tensor import Tensor

NUMPY_DOMAIN = np.lib.tracemalloc_domain
MB = 10**6


class TraceError(RuntimeError):
    """Tracing was started twice, or ended without being started."""


CATEGORIES = ("inputs", "parameters", "activations kept", "activations recomputed", "gradients",
              "optimizer state", "temporaries")
# "temporaries": NumPy bytes alive that no tensor, grad or optimizer state holds (an op's or a step's scratch)


@dataclass(frozen=True)
class Buffer:
    """One live buffer in a ``tracing()`` snapshot, counted once however many tensors view it.

    ``key`` names the buffer for the whole trace (``id()`` is reused once a buffer is freed);
    ``shape``, ``dtype`` and ``nbytes`` are the allocated array's, not a view's; ``op`` made the
    tensor that holds it (None for a leaf); ``phase`` ("forward", "backward" or "recompute") is when
    it was allocated; ``kind`` is "value" or "grad".
    """

    key: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    category: str
    op: str | None
    phase: str
    kind: str


@dataclass(frozen=True)
class Snapshot:
    """Bytes alive at one moment of a trace, with a label saying what just ran.

    In a ``tracing()`` timeline, ``categories`` is ag's own count of the same moment: the
    bytes held by tensors made (or given a grad) inside the trace, by CATEGORIES; ``buffers``
    lists those bytes one buffer at a time (per category they sum to ``categories``), and
    ``time_ns`` is ``time.perf_counter_ns()`` when the step finished, less the time tracing itself
    has spent so far, so the gap between two snapshots is the engine's own time.
    """

    allocated_bytes: int
    peak_bytes: int
    op: str | None = None
    phase: str | None = None
    tensor: str | None = None
    categories: dict | None = None
    time_ns: int | None = None
    buffers: tuple[Buffer, ...] | None = None

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
    tracing_ns: int = 0  # time spent taking tracing() snapshots, left out of their time_ns


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


def device_module(device):
    """The array module that ``device`` names: "gpu" means CuPy; a module with
    ``get_default_memory_pool`` (CuPy, or a test double) is used as given."""
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
        xp = device_module(device)
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


def measure_activation_bytes(model, x: Tensor) -> int:
    """Bytes a forward of ``model`` on ``x`` leaves alive for backward, the paper's way.

    tracemalloc counts NumPy's buffers made during the forward (parameters exist before);
    the output is not counted (it is the next layer's input) and the input is (the first
    layer norm keeps it): kept = after − before − output.nbytes + input.nbytes.
    """
    start_trace()
    try:
        out = model(x)
        alive = snapshot_trace().allocated_bytes
    finally:
        end_trace()
    return alive - out.value.nbytes + x.value.nbytes


@contextlib.contextmanager
def tracing(device="cpu") -> Iterator[list[Snapshot]]:
    """Trace a block and record a labelled snapshot after every op and every backward step
    (``device`` as in ``start_trace``).

    >>> with tracing() as timeline:
    ...     loss = ag.sum(ag.relu(x @ w)); loss.backward()
    >>> [s.label for s in timeline]   # ['forward matmul', 'forward relu', ..., 'backward matmul']
    """
    start_trace(device)
    try:
        with watching(_timelines, []) as timeline:
            yield timeline
    finally:
        if not _timelines:
            _forget_tensors()
        end_trace()


_phases: list[str] = []  # the phases entered and not yet left, innermost last


def current_phase() -> str:
    """The phase the engine last entered and has not left ("phase entered" and "phase left" events):
    "backward", "recompute", or "forward" outside any."""
    return _phases[-1] if _phases else "forward"


def _phase_left(name: str) -> None:
    _phases.pop()


def record(phase: str, op: str, tensor: str | None) -> None:
    """A snapshot after an op or a backward step, in every open timeline; a no-op unless one is open."""
    if _timelines:
        _record_snapshot(phase, op, tensor)


def _op_run(output, call: tuple) -> None:
    record(current_phase(), output.op, None)


def _step_done(op: str, name: str | None, snapshots: list | None) -> None:
    record("backward", op, name)
    if snapshots is not None:
        snapshots.append(snapshot_trace(op, "backward", name))


def _record_snapshot(phase: str, op: str, tensor: str | None) -> None:
    """Append one snapshot, with ag's categories and buffers, to every open timeline."""
    started = time.perf_counter_ns()
    snap = snapshot_trace(op, phase, tensor)
    categories, buffers = _categories_and_buffers(phase)
    categories["temporaries"] = max(0, snap.allocated_bytes - sum(categories.values()))
    snap = replace(snap, categories=categories, buffers=buffers, time_ns=started - _session.tracing_ns)
    for timeline in _timelines:
        timeline.append(snap)
    _session.tracing_ns += time.perf_counter_ns() - started


# While a timeline is open: the tensors made in it and those given a grad in it, each with a
# number for its name (weak keys, so tracing keeps nothing alive), and every buffer seen so far.
_made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_graded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_recomputed: weakref.WeakSet = weakref.WeakSet()  # those made while a rematerializer ran
_states: list = []  # (weak reference to a state array, its parameter, its name, its number)
_numbers = itertools.count()


def watch_value(tensor) -> None:
    """Every Tensor made while a timeline is open is counted by category (one a rematerializer
    makes counts as recomputed)."""
    if _timelines:
        _made[tensor] = next(_numbers)
        if current_phase() == "recompute":
            _recomputed.add(tensor)


def watch_grad(tensor) -> None:
    """A grad buffer allocated while a timeline is open is counted under "gradients"."""
    if _timelines and tensor not in _graded:
        _graded[tensor] = _made[tensor] if tensor in _made else next(_numbers)


def watch_state(param, name: str, array: np.ndarray) -> None:
    """Called by an optimizer when it allocates ``array``, state ``name`` of ``param`` (Adam's
    "exp_avg", mixed precision's float32 "master" copy): counted as "optimizer state"."""
    if _timelines:
        _states.append((weakref.ref(array), param, name, next(_numbers)))


def _categories_and_buffers(phase: str) -> tuple[dict[str, int], tuple[Buffer, ...]]:
    """Live bytes by category and one Buffer per live buffer, in one pass: each underlying buffer
    once (views and handed-on grads share memory), filed under the first tensor made that holds it."""
    totals = dict.fromkeys(CATEGORIES, 0)
    bases: dict[int, object] = {}  # held until the pass ends, so no id() is reused within it
    buffers: list[Buffer] = []
    _states[:] = [entry for entry in _states if entry[0]() is not None]
    holders = [(p, ref(), f"state {name}", "optimizer state", n) for ref, p, name, n in _states]
    holders += [(t, t.value, "value", _value_category(t), n) for t, n in list(_made.items())]
    holders += [(t, t.grad, "grad", "gradients", n) for t, n in list(_graded.items())]
    for tensor, array, kind, category, number in holders:
        base = _allocated_array(array)
        if base is None or id(base) in bases:
            continue
        bases[id(base)] = base
        totals[category] += base.nbytes
        buffers.append(_buffer(base, tensor, number, kind, category, phase))
    return totals, tuple(buffers)


def _allocated_array(array):
    """The array that owns ``array``'s memory: a view's base, followed to the end."""
    while array is not None and getattr(array.base, "dtype", None) is not None:
        array = array.base
    return array


def _value_category(t) -> str:
    if t.op is None:
        return "parameters" if t.requires_grad else "inputs"
    recomputed = t.rematerializer is not None or t in _recomputed
    return "activations recomputed" if recomputed else "activations kept"


@dataclass(eq=False)
class _Seen:
    """What tracing remembers of one buffer: who it is, its key, when it was allocated, and the
    Buffer last recorded for it (shared by the snapshots in which nothing about it changed)."""

    ref: weakref.ref | None
    key: int
    phase: str
    buffer: Buffer | None = None


_seen: dict[int, _Seen] = {}  # by id() of the allocated array
_keys = itertools.count()


def _buffer(base, tensor, number: int, kind: str, category: str, phase: str) -> Buffer:
    """The Buffer for ``base`` held by ``tensor``: the last one recorded, unless something changed
    (a grad handed on to another tensor keeps its key and takes that tensor's name); state
    arrays come as kind "state <name>" and are named "<parameter>.<name>"."""
    seen = _identify(base, phase, kind == "value" and tensor.rematerializer is not None)
    name = tensor.name or _default_name(tensor, number)
    if kind.startswith("state "):
        kind, name = "state", f"{name}.{kind[6:]}"
    old = seen.buffer
    if old is None or (old.name, old.category, old.op, old.kind) != (name, category, tensor.op, kind):
        seen.buffer = Buffer(seen.key, name, tuple(base.shape), str(base.dtype), base.nbytes,
                             category, tensor.op, seen.phase, kind)
    return seen.buffer


def _default_name(tensor, number: int) -> str:
    """"matmul#12" for an unnamed op output, "parameter#3" or "input#0" for an unnamed leaf."""
    if tensor.op is not None:
        return f"{tensor.op}#{number}"
    return f"{'parameter' if tensor.requires_grad else 'input'}#{number}"


def _identify(base, phase: str, recomputable: bool) -> _Seen:
    """The record of ``base``, made the first time it is seen: ``id()`` is reused once a buffer is
    freed, so a weak reference confirms it is the same array. A recomputable value first seen in a
    backward step was made by its rematerializer there: its phase is "recompute"."""
    seen = _seen.get(id(base))
    if seen is not None and (seen.ref is None or seen.ref() is base):
        return seen
    try:
        ref = weakref.ref(base)
    except TypeError:  # an array type without weak references: id() alone must do
        ref = None
    if recomputable and phase == "backward":
        phase = "recompute"
    seen = _seen[id(base)] = _Seen(ref, next(_keys), phase)
    return seen


def _forget_tensors() -> None:
    """The last timeline closed: keys and names start again from 0 in the next one."""
    global _numbers, _keys
    _made.clear()
    _graded.clear()
    _recomputed.clear()
    _states.clear()
    _seen.clear()
    _numbers, _keys = itertools.count(), itertools.count()


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
    with watching(_counters, OpCounts()) as counts:  # the ops publish their products only while watched
        yield counts


def count_matmul(flops: int) -> None:
    """Count one matrix product in every open ``count_ops``, in the current phase; a no-op unless one is open."""
    phase = current_phase()
    for counts in _counters:
        counts.matmuls[phase] += 1
        counts.flops[phase] += flops


hooks.subscribe("phase entered", _phases.append)
hooks.subscribe("phase left", _phase_left)
hooks.subscribe("tensor created", watch_value)
hooks.subscribe("op run", _op_run)
hooks.subscribe("grad allocated", watch_grad)
hooks.subscribe("step done", _step_done)
hooks.subscribe("product counted", count_matmul)


def _numpy_traces() -> Counter:
    snapshot = tracemalloc.take_snapshot()
    return Counter((t.size, t.traceback) for t in snapshot.traces if t.domain == NUMPY_DOMAIN)
