"""A ``tracing()`` timeline, written for the viewers people already use.

- ``export_perfetto(timeline, path)``: Chrome's trace-event JSON. Open it at https://ui.perfetto.dev
  (Open trace file) or in chrome://tracing (Load): every op and backward step is a span, and live
  bytes by category run beneath as counter tracks.
- ``export_torch_snapshot(timeline, path)``: the pickle of PyTorch's ``torch.cuda.memory._snapshot()``.
  Drag it onto https://pytorch.org/memory_viz, beside a real CUDA snapshot, or run
  ``python -m torch.cuda._memory_viz trace_plot path -o out.html`` and open ``out.html``.

Both draw on what ``ag.trace.tracing()`` recorded (``Snapshot.buffers`` and ``time_ns``) and measure
nothing themselves. Both are also ``ag.trace.export_perfetto`` and ``ag.trace.export_torch_snapshot``.
"""
from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

PID = TID = 1             # one process, "ag", with one thread of ops and backward steps
ADDRESS_BASE = 0x7F0000000000  # the made-up addresses start where a heap would
ALIGNMENT = 512           # as CUDA's caching allocator rounds its blocks
PICKLE_PROTOCOL = 4       # memory_viz's own unpickler reads protocols 2 to 4, and no NumPy types


def export_perfetto(timeline, path: str | os.PathLike) -> Path:
    """Write ``timeline`` (the snapshots of one ``ag.trace.tracing()`` run) as Chrome trace-event JSON.

    Open it at https://ui.perfetto.dev (Open trace file) or in chrome://tracing (Load). Each op and
    backward step is a complete event ("X"): name the op, category the phase, args the tensor, the
    bytes, and the buffers the step allocated and freed; the ops a rematerializer ran sit inside the
    step that needed them. Counter events ("C"): "ag live bytes" has one series per category
    (stacked in chrome://tracing, a track each in Perfetto) and "tracemalloc" the allocated bytes
    (on a GPU timeline, the device pool's).
    Times are the engine's own, tracing's overhead left out; the first step's start was not
    recorded, so that span has no width.
    """
    _check(timeline, "export_perfetto")
    path = Path(path)
    path.write_text(json.dumps({"traceEvents": _trace_events(timeline), "displayTimeUnit": "ms"}))
    return path


def export_torch_snapshot(timeline, path: str | os.PathLike) -> Path:
    """Write ``timeline`` (the snapshots of one ``ag.trace.tracing()`` run) as the pickle of
    ``torch.cuda.memory._snapshot()``.

    Open it by dragging it onto https://pytorch.org/memory_viz, or run
    ``python -m torch.cuda._memory_viz trace_plot path -o out.html`` and open ``out.html``
    (``stats path`` and ``trace path`` print it as text). Hover a block to read its frames: the
    tensor's name, kind, shape and dtype under its category, then the op and phase that made it.

    NumPy has no caching allocator (every array is its own ``malloc``, given back when it dies), so
    every buffer is a segment of its own here: reserved equals allocated. Addresses are made up,
    512-aligned and never reused. NumPy bytes that no tensor holds (temporaries, arrays made
    outside ag) are one block of category "unknown". Within a step frees come before allocations,
    so the viewer's peak is the timeline's own; the moment between, which no snapshot sees, is in
    ``Snapshot.peak_bytes``.
    """
    _check(timeline, "export_torch_snapshot")
    path = Path(path)
    path.write_bytes(pickle.dumps(_torch_snapshot(timeline), protocol=PICKLE_PROTOCOL))
    return path


def _check(timeline, who: str) -> None:
    """Refuse what ``tracing()`` did not record: the exports need buffers and times, in order."""
    if not timeline:
        raise ValueError(f"{who}: the timeline is empty; record one with "
                         "`with ag.trace.tracing() as timeline:` around at least one op")
    for i, s in enumerate(timeline):
        if getattr(s, "buffers", None) is None or getattr(s, "time_ns", None) is None or s.categories is None:
            raise ValueError(f"{who}: snapshot {i} ({s.label or 'no label'}) has no buffers or time_ns; "
                             "only ag.trace.tracing() records them (snapshot_trace() and "
                             "backward(trace=True) count bytes only)")
        if i and s.time_ns < timeline[i - 1].time_ns:
            raise ValueError(f"{who}: snapshot {i} ({s.label}) was taken before snapshot {i - 1}; "
                             "pass the snapshots of one tracing() run, in order")


def _changes(timeline) -> list[tuple[list, list]]:
    """For each snapshot, the buffers that appeared since the one before and those that went, by key."""
    before: dict = {}
    changes = []
    for s in timeline:
        now = {b.key: b for b in s.buffers}
        changes.append(([b for k, b in now.items() if k not in before],
                        [b for k, b in before.items() if k not in now]))
        before = now
    return changes


def _describe(b) -> str:
    return f"{b.name} {b.kind} {b.dtype}{list(b.shape)} {b.nbytes} bytes ({b.category})"


# Perfetto and chrome://tracing

def _trace_events(timeline) -> list[dict]:
    times = _microseconds(timeline)
    changes = _changes(timeline)
    events = _metadata()
    for i, start, end in _spans(timeline, times):
        events.append(_span(timeline[i], start, end, *changes[i]))
    for s, ts in zip(timeline, times):
        events += _counters(s, ts)
    return events


def _microseconds(timeline) -> list[float]:
    """Each snapshot's time in µs since the first, in steps of 1/8 µs (125 ns): such numbers are
    exact in binary floating point, so every viewer adds ts + dur of nested spans without rounding."""
    start = timeline[0].time_ns
    return [round((s.time_ns - start) / 125) / 8 for s in timeline]


def _spans(timeline, times: list[float]) -> list[tuple[int, float, float]]:
    """(snapshot index, start, end) of each step, in time order, a step before the recomputes it
    holds: a step runs from the snapshot before to its own, and one that needed recomputes starts
    where they started, so their spans nest inside its span."""
    spans, held, step_start = [], [], times[0]
    for i, s in enumerate(timeline):
        if s.phase == "recompute":
            held.append((i, times[max(i - 1, 0)], times[i]))
        else:
            spans += [(i, step_start, times[i]), *held]
            held, step_start = [], times[i]
    return spans + held


def _span(s, start: float, end: float, allocated: list, freed: list) -> dict:
    args = {"live bytes": sum(s.categories.values()), "allocated bytes": s.allocated_bytes,
            "peak bytes": s.peak_bytes, "allocated": [_describe(b) for b in allocated],
            "freed": [_describe(b) for b in freed]}
    tensor = _output_name(s, allocated)
    if tensor is not None:
        args = {"tensor": tensor, **args}
    return {"name": s.op or "step", "cat": s.phase or "", "ph": "X", "ts": start, "dur": end - start,
            "pid": PID, "tid": TID, "args": args}


def _output_name(s, allocated: list) -> str | None:
    """The tensor an op made: its name if it has one, else the name of the buffer it allocated."""
    if s.tensor or s.phase == "backward":
        return s.tensor
    return next((b.name for b in reversed(allocated) if b.kind == "value" and b.op == s.op), None)


def _counters(s, ts: float) -> list[dict]:
    common = {"ph": "C", "ts": ts, "pid": PID, "tid": TID}
    return [{"name": "ag live bytes", **common, "args": dict(s.categories)},
            {"name": "tracemalloc", **common, "args": {"allocated bytes": s.allocated_bytes}}]


def _metadata() -> list[dict]:
    common = {"ph": "M", "ts": 0, "pid": PID, "tid": TID}
    return [{"name": "process_name", **common, "args": {"name": "ag"}},
            {"name": "thread_name", **common, "args": {"name": "ops and backward steps"}}]


# pytorch.org/memory_viz

@dataclass(frozen=True)
class _Block:
    address: int
    size: int
    category: str
    frames: list


def _torch_snapshot(timeline) -> dict:
    """The snapshot: alloc and free events diffed from one snapshot to the next, and the segments
    alive at the end (memory_viz replays the events backwards from them)."""
    live: dict = {}
    trace: list[dict] = []
    next_address = ADDRESS_BASE
    for i, s in enumerate(timeline):
        time_us = (s.time_ns - timeline[0].time_ns) // 1000
        now = _holders(s)
        for key in [k for k in live if k not in now]:
            trace += _events(("free_requested", "free_completed", "segment_free"), live.pop(key), time_us)
        for key, (size, buffer) in now.items():
            if key not in live:
                live[key] = _Block(next_address, size, buffer.category if buffer else "unknown",
                                   _frames(buffer, s, i))
                next_address += -(-size // ALIGNMENT) * ALIGNMENT
                trace += _events(("segment_alloc", "alloc"), live[key], time_us)
    # memory_viz's page fails when events carry categories and none is "unknown"
    trace.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": time_us,
                  "frames": [], "category": "unknown"})
    return {"segments": [_segment(b) for b in live.values()], "device_traces": [trace]}


def _holders(s) -> dict:
    """What holds memory at snapshot ``s``: each buffer by its key, and the NumPy bytes no tensor
    holds under ("unknown", size), a key that changes when the size does."""
    holders = {b.key: (b.nbytes, b) for b in s.buffers if b.nbytes > 0}
    unknown = s.allocated_bytes - sum(n for c, n in s.categories.items() if c != "temporaries")
    if unknown > 0:
        holders[("unknown", unknown)] = (unknown, None)
    return holders


def _frames(buffer, s, step: int) -> list[dict]:
    """What memory_viz shows as the block's stack: the tensor, then the op that made it."""
    seen = f"seen first after step {step}, {s.label}"
    if buffer is None:
        return [{"filename": "unknown", "line": 0, "name": "NumPy bytes that no ag tensor holds"},
                {"filename": "ag", "line": step, "name": seen}]
    made = f"made by {buffer.op or 'no op (a leaf)'} in {buffer.phase}"
    return [{"filename": buffer.category, "line": buffer.key,
             "name": f"{buffer.name} {buffer.kind} {buffer.dtype}{list(buffer.shape)}"},
            {"filename": "ag", "line": step, "name": f"{made}, {seen}"}]


def _events(actions: tuple[str, ...], block: _Block, time_us: int) -> list[dict]:
    return [{"action": action, "addr": block.address, "size": block.size, "stream": 0, "time_us": time_us,
             "frames": block.frames, "category": block.category} for action in actions]


def _segment(block: _Block) -> dict:
    """A block alive at the end, as the segment that holds only it (one malloc per NumPy array)."""
    size = block.size
    return {"device": 0, "address": block.address, "total_size": size, "allocated_size": size,
            "active_size": size, "requested_size": size, "stream": 0,
            "segment_type": "large" if size > 1 << 20 else "small", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": block.frames,
            "blocks": [{"address": block.address, "size": size, "requested_size": size,
                        "state": "active_allocated", "frames": block.frames}]}
