"""ag.trace's per-buffer records, and the timeline exported for Perfetto and PyTorch's memory_viz."""
import gc
import json
import math
import pickle
import pickletools
import re
import subprocess
import sys
import weakref
from collections import defaultdict

import jsonschema
import numpy as np
import pytest

import ag
from ag import trace


def mlp_step(rng) -> list[trace.Snapshot]:
    """One training step of a two-layer MLP, its data and parameters made inside the trace."""
    with trace.tracing() as timeline:
        x = ag.Tensor(rng.standard_normal((64, 32)), name="x")
        w1 = ag.Tensor(rng.standard_normal((32, 48)) / 6, requires_grad=True, name="w1")
        b1 = ag.Tensor(np.zeros(48), requires_grad=True, name="b1")
        w2 = ag.Tensor(rng.standard_normal((48, 10)) / 7, requires_grad=True, name="w2")
        h = ag.relu(x @ w1 + b1)
        h.name = "h"
        ag.sum(h @ w2).backward()
    return timeline


def remat_step(rng, mode: str = "tensor") -> list[trace.Snapshot]:
    """Five tanh layers, no checkpoint: backward recomputes every activation from the input."""
    weights = [ag.Tensor(rng.standard_normal((32, 32)) / 6, requires_grad=True, name=f"w{i}") for i in range(5)]
    layers = [lambda h, w=w: ag.tanh(h @ w) for w in weights]
    x = ag.Tensor(rng.standard_normal((64, 32)), name="x")
    with trace.tracing() as timeline:
        ag.sum(ag.remat.sequential(layers, x, [], mode=mode)).backward()
    return timeline


@pytest.fixture(params=["mlp", "remat tensor", "remat segment"])
def timeline(request, rng):
    if request.param == "mlp":
        return mlp_step(rng)
    return remat_step(rng, request.param.split()[1])


def live_bytes(s: trace.Snapshot) -> int:
    return sum(s.categories.values())


def test_the_buffers_of_each_category_sum_to_its_bytes(timeline):
    for s in timeline:
        for category in trace.CATEGORIES:
            held = sum(b.nbytes for b in s.buffers if b.category == category)
            assert held == s.categories[category], f"{s.label}: {category}"


def test_every_buffer_is_listed_once_with_a_category_a_phase_and_a_kind(timeline):
    for s in timeline:
        assert len({b.key for b in s.buffers}) == len(s.buffers), s.label
        for b in s.buffers:
            assert b.category in trace.CATEGORIES
            assert b.phase in ("forward", "backward", "recompute")
            assert b.kind in ("value", "grad")
            assert (b.kind == "grad") == (b.category == "gradients")


def test_a_buffer_keeps_its_key_its_shape_and_its_phase_while_it_lives(timeline):
    first: dict[int, trace.Buffer] = {}
    for s in timeline:
        for b in s.buffers:
            seen = first.setdefault(b.key, b)
            assert (b.shape, b.dtype, b.nbytes, b.phase) == (seen.shape, seen.dtype, seen.nbytes, seen.phase)
            assert b.nbytes == math.prod(b.shape) * np.dtype(b.dtype).itemsize


def test_a_freed_buffer_never_comes_back_under_its_key(timeline):
    alive, gone = set(), set()
    for s in timeline:
        now = {b.key for b in s.buffers}
        assert not now & gone, s.label
        gone |= alive - now
        alive = now


def test_a_new_array_at_a_freed_arrays_id_gets_a_new_key():
    x = ag.Tensor(np.ones((10, 10)))
    with trace.tracing() as timeline:
        a = ag.exp(x)
        freed_id = id(a.value)
        del a
        for _ in range(20):  # CPython hands a freed object's memory, and so its id, to the next one
            b = ag.exp(x)
            reused = id(b.value) == freed_id
            if reused:
                break
            del b
    assert reused, "no array took the freed id: the test proves nothing"
    keys = [s.buffers[0].key for s in timeline]  # one live exp output after each op
    assert len(set(keys)) == len(keys)


def test_a_buffer_is_named_after_its_tensor_or_after_the_op_that_made_it(rng):
    timeline = mlp_step(rng)
    names = {b.name for s in timeline for b in s.buffers}
    assert {"x", "w1", "b1", "w2", "h"} <= names
    first = timeline[0].buffers[-1]  # x @ w1, which nobody named
    assert re.fullmatch(r"matmul#\d+", first.name)
    assert (first.op, first.phase, first.kind) == ("matmul", "forward", "value")
    assert (first.shape, first.dtype) == ((64, 48), "float64")


def test_leaves_have_no_op_and_their_grads_are_allocated_in_backward(rng):
    last = mlp_step(rng)[-1]
    grads = {b.name: b for b in last.buffers if b.kind == "grad"}
    assert set(grads) == {"w1", "b1", "w2"}
    assert all(b.op is None and b.phase == "backward" and b.category == "gradients" for b in grads.values())
    assert {b.name: b.category for b in last.buffers if b.kind == "value" and b.op is None} == {
        "x": "inputs", "w1": "parameters", "b1": "parameters", "w2": "parameters"}


def test_a_buffers_phase_is_the_phase_of_the_step_that_allocated_it(timeline):
    seen = set()
    for s in timeline:
        for b in s.buffers:
            if b.key not in seen:
                assert b.phase == s.phase, f"{b.name} first seen after {s.label}"
            seen.add(b.key)


def test_activations_that_backward_recomputed_were_allocated_in_the_recompute_phase(rng):
    timeline = remat_step(rng)
    recomputed = [b for s in timeline for b in s.buffers if b.category == "activations recomputed"]
    assert recomputed and {b.phase for b in recomputed} == {"recompute"}  # forward's were dropped when used


def test_a_value_a_plain_numpy_rematerializer_made_in_a_backward_step_was_recomputed(rng):
    x = ag.Tensor(rng.standard_normal((8, 8)), requires_grad=True)
    with trace.tracing() as timeline:
        h = ag.tanh(x)
        h.rematerializer = lambda: np.tanh(x.value)
        ag.sum(h * h).backward()  # mul discards h; its backward step needs h again
    step = next(s for s in timeline if s.label == "backward mul")
    again = [b for b in step.buffers if b.category == "activations recomputed"]
    assert [(b.shape, b.phase) for b in again] == [((8, 8), "recompute")]


def test_a_view_adds_no_buffer(rng):
    x = ag.Tensor(rng.standard_normal((8, 8)), requires_grad=True)
    with trace.tracing() as timeline:
        ag.sum(ag.reshape(ag.exp(x), (64,)))
    assert [len(s.buffers) for s in timeline] == [1, 1, 2]  # exp, its reshape (a view), the sum


def test_snapshot_times_are_integers_that_never_go_back(timeline):
    times = [s.time_ns for s in timeline]
    assert all(type(t) is int for t in times)
    assert times == sorted(times)


def test_snapshots_taken_outside_a_timeline_have_no_buffers_or_time():
    trace.start_trace()
    stats = trace.snapshot_trace()
    trace.end_trace()
    assert stats.buffers is None and stats.time_ns is None


def test_tracing_keeps_no_array_alive(rng):
    with trace.tracing():
        t = ag.exp(ag.Tensor(rng.standard_normal(1000)))
        ref = weakref.ref(t.value)
        del t
        gc.collect()
        assert ref() is None


EVENT = {
    "type": "object",
    "required": ["name", "ph", "ts", "pid", "tid"],
    "properties": {
        "name": {"type": "string"}, "cat": {"type": "string"}, "ph": {"enum": ["X", "C", "M"]},
        "ts": {"type": "number", "minimum": 0}, "dur": {"type": "number", "minimum": 0},
        "pid": {"type": "integer"}, "tid": {"type": "integer"}, "args": {"type": "object"},
    },
    "allOf": [
        {"if": {"properties": {"ph": {"const": "X"}}}, "then": {"required": ["dur", "cat", "args"]}},
        {"if": {"properties": {"ph": {"const": "C"}}},
         "then": {"required": ["args"], "properties": {"args": {
             "minProperties": 1, "additionalProperties": {"type": "number"}}}}},
        {"if": {"properties": {"ph": {"const": "M"}}},
         "then": {"properties": {"name": {"enum": ["process_name", "thread_name"]},
                                 "args": {"required": ["name"], "properties": {"name": {"type": "string"}}}}}},
    ],
}
TRACE = {"type": "object", "required": ["traceEvents", "displayTimeUnit"],
         "properties": {"traceEvents": {"type": "array", "items": EVENT}, "displayTimeUnit": {"const": "ms"}}}


def perfetto(timeline, tmp_path) -> list[dict]:
    path = trace.export_perfetto(timeline, tmp_path / "step.json")
    document = json.loads(path.read_text())
    jsonschema.validate(document, TRACE)
    return document["traceEvents"]


def spans(events) -> list[dict]:
    return [e for e in events if e["ph"] == "X"]


def assert_spans_nest(events) -> None:
    """On each track: spans start in order, and a span that starts inside another ends inside it."""
    tracks = defaultdict(list)
    for e in spans(events):
        tracks[e["pid"], e["tid"]].append(e)
    for track in tracks.values():
        open_ends: list[float] = []
        for before, e in zip([None, *track], track):
            assert before is None or before["ts"] <= e["ts"], f"{e['name']} starts before {before['name']}"
            end = e["ts"] + e["dur"]
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], f"{e['name']} at {e['ts']} overlaps its parent's end"
            open_ends.append(end)


def test_the_perfetto_export_follows_the_trace_event_format(timeline, tmp_path):
    events = perfetto(timeline, tmp_path)
    assert_spans_nest(events)
    for name in ("ag live bytes", "tracemalloc"):
        times = [e["ts"] for e in events if e["ph"] == "C" and e["name"] == name]
        assert times == sorted(times) and len(times) == len(timeline)
    metadata = {e["name"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert metadata["process_name"] == "ag" and metadata["thread_name"]


def test_the_nesting_checker_catches_spans_that_overlap():
    events = [{"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
              {"ph": "X", "name": "b", "ts": 5, "dur": 10, "pid": 1, "tid": 1}]
    with pytest.raises(AssertionError, match="overlaps"):
        assert_spans_nest(events)


def test_every_op_and_backward_step_is_a_span_named_after_the_op_in_its_phase(timeline, tmp_path):
    found = [(e["cat"], e["name"]) for e in spans(perfetto(timeline, tmp_path))]
    assert sorted(found) == sorted((s.phase, s.op) for s in timeline)


def test_recomputes_sit_inside_the_step_that_needed_them(rng, tmp_path):
    events = spans(perfetto(remat_step(rng), tmp_path))
    recomputes = [e for e in events if e["cat"] == "recompute"]
    assert recomputes
    for r in recomputes:
        holders = [e for e in events if e["cat"] == "backward"
                   and e["ts"] <= r["ts"] and r["ts"] + r["dur"] <= e["ts"] + e["dur"] and e["dur"] > 0]
        assert len(holders) == 1, f"recompute {r['name']} at {r['ts']}"


def test_the_top_level_spans_run_end_to_end_from_the_first_step_to_the_last(timeline, tmp_path):
    top = [e for e in spans(perfetto(timeline, tmp_path)) if e["cat"] != "recompute"]
    for before, after in zip(top, top[1:]):
        assert before["ts"] + before["dur"] == after["ts"]
    elapsed_us = (timeline[-1].time_ns - timeline[0].time_ns) / 1000
    assert top[0]["ts"] == 0 and abs(top[-1]["ts"] + top[-1]["dur"] - elapsed_us) <= 0.0625  # 125 ns steps


def test_the_counters_carry_the_categories_and_tracemalloc_at_every_step(timeline, tmp_path):
    events = perfetto(timeline, tmp_path)
    live = [e["args"] for e in events if e["ph"] == "C" and e["name"] == "ag live bytes"]
    allocated = [e["args"]["allocated bytes"] for e in events if e["ph"] == "C" and e["name"] == "tracemalloc"]
    assert live == [s.categories for s in timeline]
    assert allocated == [s.allocated_bytes for s in timeline]


def test_a_span_lists_the_buffers_its_step_allocated_and_freed(rng, tmp_path):
    events = spans(perfetto(mlp_step(rng), tmp_path))
    relu = next(e for e in events if e["name"] == "relu" and e["cat"] == "forward")
    assert relu["args"]["tensor"].startswith("relu#")
    output = relu["args"]["tensor"]
    assert relu["args"]["allocated"] == [f"{output} value float64[64, 48] 24576 bytes (activations kept)"]
    last = events[-1]
    assert (last["cat"], last["name"]) == ("backward", "matmul") and last["args"]["freed"]


def torch_snapshot(timeline, tmp_path) -> dict:
    path = trace.export_torch_snapshot(timeline, tmp_path / "step.pickle")
    return pickle.loads(path.read_bytes())


def replay(events) -> tuple[int, int]:
    """Replay memory_viz's events: the peak of every block, and the peak of ag's tensors alone."""
    live, peak, tensors_peak = {}, 0, 0
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            del live[e["addr"]]
        peak = max(peak, sum(b["size"] for b in live.values()))
        tensors_peak = max(tensors_peak, sum(b["size"] for b in live.values() if b["category"] != "unknown"))
    return peak, tensors_peak


def test_the_torch_snapshot_holds_plain_python_values_only(timeline, tmp_path):
    snapshot = torch_snapshot(timeline, tmp_path)
    stack = [snapshot]
    while stack:
        item = stack.pop()
        assert type(item) in (dict, list, tuple, str, int, bool, type(None)), type(item)
        stack.extend(item.values() if type(item) is dict else item if type(item) in (list, tuple) else ())
        if type(item) is dict:
            assert all(type(k) is str for k in item)


# the opcodes that the unpickler of memory_viz's page (torch/utils/viz/MemoryViz.js) reads
MEMORY_VIZ_OPCODES = {
    "PROTO", "FRAME", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "MARK", "STOP",
    "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT", "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "SETITEM", "SETITEMS", "APPEND", "APPENDS", "NEWFALSE", "NEWTRUE", "NONE", "BININT", "BININT1",
    "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE"}


def test_the_torch_snapshot_is_a_pickle_that_memory_viz_can_read(rng, tmp_path):
    data = trace.export_torch_snapshot(remat_step(rng), tmp_path / "step.pickle").read_bytes()
    ops = list(pickletools.genops(data))
    assert ops[0][0].name == "PROTO" and 2 <= ops[0][1] <= 4
    assert {op.name for op, _, _ in ops} <= MEMORY_VIZ_OPCODES


def test_replaying_the_torch_snapshot_reaches_ags_peak(timeline, tmp_path):
    peak, tensors_peak = replay(torch_snapshot(timeline, tmp_path)["device_traces"][0])
    assert tensors_peak == max(live_bytes(s) for s in timeline)
    assert peak == max(max(s.allocated_bytes, live_bytes(s)) for s in timeline)


def test_the_segments_are_what_is_alive_after_the_last_step(timeline, tmp_path):
    snapshot = torch_snapshot(timeline, tmp_path)
    events = snapshot["device_traces"][0]
    freed = {e["addr"] for e in events if e["action"] == "free_completed"}
    alive = [e for e in events if e["action"] == "alloc" and e["addr"] not in freed]
    segments = snapshot["segments"]
    assert sorted(s["address"] for s in segments) == sorted(e["addr"] for e in alive)
    last = timeline[-1]
    unknown = max(0, last.allocated_bytes - live_bytes(last))
    assert sum(s["total_size"] for s in segments) == live_bytes(last) + unknown
    for s in segments:
        assert [b["size"] for b in s["blocks"]] == [s["total_size"]] == [s["allocated_size"]]
        assert s["blocks"][0]["state"] == "active_allocated" and s["blocks"][0]["address"] == s["address"]


def test_every_block_has_its_own_aligned_address(timeline, tmp_path):
    allocs = [e for e in torch_snapshot(timeline, tmp_path)["device_traces"][0] if e["action"] == "segment_alloc"]
    starts = [e["addr"] for e in allocs]
    assert starts == sorted(set(starts)) and all(a % 512 == 0 for a in starts)
    assert all(a["addr"] + a["size"] <= b["addr"] for a, b in zip(allocs, allocs[1:]))


def test_every_live_block_lies_in_a_live_segment_at_every_event(timeline, tmp_path):
    """memory_viz's segment view replays the events and looks up each block's segment."""
    segments, blocks = {}, {}
    for e in torch_snapshot(timeline, tmp_path)["device_traces"][0]:
        action, addr = e["action"], e["addr"]
        if action == "segment_alloc":
            segments[addr] = e["size"]
        elif action == "alloc":
            assert any(s <= addr and addr + e["size"] <= s + size for s, size in segments.items())
            blocks[addr] = e["size"]
        elif action == "free_completed":
            del blocks[addr]
        elif action == "segment_free":
            assert not any(addr <= b < addr + segments[addr] for b in blocks)
            del segments[addr]


def test_a_blocks_frames_name_the_tensor_and_the_op_and_phase_that_made_it(rng, tmp_path):
    events = torch_snapshot(mlp_step(rng), tmp_path)["device_traces"][0]
    block = next(e for e in events if e["action"] == "alloc" and e["frames"][0]["name"].startswith("relu#"))
    tensor, made = block["frames"]
    assert re.fullmatch(r"relu#\d+ value float64\[64, 48\]", tensor["name"])
    assert tensor["filename"] == block["category"] == "activations kept"
    assert made["name"].startswith("made by relu in forward, seen first after step")
    assert all(set(f) == {"filename", "line", "name"} for e in events for f in e["frames"])


def test_numpy_bytes_no_tensor_holds_are_a_block_of_category_unknown(rng, tmp_path):
    x = ag.Tensor(rng.standard_normal((16, 16)), requires_grad=True)
    with trace.tracing() as timeline:
        y = ag.exp(x)
        scratch = np.ones(1000)  # NumPy memory that no tensor holds
        ag.sum(y).backward()
    events = torch_snapshot(timeline, tmp_path)["device_traces"][0]
    unknown = [e for e in events if e["action"] == "alloc" and e["category"] == "unknown"]
    assert [e["size"] for e in unknown] == [scratch.nbytes]
    assert unknown[0]["frames"][0]["name"] == "NumPy bytes that no ag tensor holds"


def test_some_event_is_of_category_unknown_so_that_memory_viz_loads_it(rng, tmp_path):
    events = torch_snapshot(mlp_step(rng), tmp_path)["device_traces"][0]
    assert any(e["category"] == "unknown" for e in events)  # MemoryViz.js fails without one


def memory_viz(*args: str) -> str:
    """Run torch's own ``python -m torch.cuda._memory_viz`` (CPU torch is enough) and return its output."""
    run = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout


UNITS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def from_memory_viz(text: str) -> tuple[float, float]:
    """A size as memory_viz prints it ("24.0KiB"): bytes, and how far off its rounding can be."""
    value, unit = re.fullmatch(r"([\d.]+)(Ki|Mi|Gi)?B", text).groups()
    scale = UNITS[unit or ""]
    return float(value) * scale, 0.05 * scale if unit else 0.0


def peak_of_memory_viz_trace(output: str) -> tuple[float, float]:
    """The peak of the blocks ``memory_viz trace`` lists (``b = a[0:24.0KiB]``, then
    ``# free completed for b 24.0KiB``), and how far its rounding can be from the true one."""
    live, peak, error = {}, 0.0, 0.0
    for line in output.splitlines():
        if m := re.fullmatch(r"(\w+) = \w+\[\d+:(\S+)\]", line):
            live[m[1]] = from_memory_viz(m[2])
        elif m := re.fullmatch(r"# free completed for (\w+) (\S+)", line):
            del live[m[1]]
        peak = max(peak, sum(size for size, _ in live.values()))
        error = max(error, sum(e for _, e in live.values()))
    return peak, error


@pytest.mark.oracle
@pytest.mark.parametrize("step", [mlp_step, remat_step])
def test_torchs_memory_viz_reads_the_snapshot_and_finds_ags_peak(step, rng, tmp_path, torch_or_skip):
    from torch.cuda._memory_viz import _format_size
    timeline = step(rng)
    path = trace.export_torch_snapshot(timeline, tmp_path / "step.pickle")
    peak, error = peak_of_memory_viz_trace(memory_viz("trace", str(path)))
    ags_peak = max(max(s.allocated_bytes, live_bytes(s)) for s in timeline)
    assert abs(peak - ags_peak) <= error, f"memory_viz trace peaks at {peak}, ag at {ags_peak}"
    last = timeline[-1]
    at_end = live_bytes(last) + max(0, last.allocated_bytes - live_bytes(last))
    stats = memory_viz("stats", str(path))
    assert f"total_allocated: {_format_size(at_end)}\n" in stats
    assert f"total_reserved: {_format_size(at_end)}\n" in stats


@pytest.mark.oracle
def test_torchs_memory_viz_draws_the_snapshot(rng, tmp_path, torch_or_skip):
    import base64
    from torch.cuda import _memory_viz
    path = trace.export_torch_snapshot(remat_step(rng), tmp_path / "step.pickle")
    snapshot = pickle.loads(path.read_bytes())
    for page in (_memory_viz.trace_plot(snapshot), _memory_viz.trace_plot(snapshot, plot_segments=True),
                 _memory_viz.segment_plot(snapshot), _memory_viz.trace_plot(snapshot, filter_freed=True)):
        embedded = json.loads(re.search(r"const local_files = (.*)\n", page)[1])[0]["base64"]
        assert pickle.loads(base64.b64decode(embedded)) is not None
    memory_viz("trace_plot", str(path), "-o", str(tmp_path / "out.html"))
    assert "add_local_files" in (tmp_path / "out.html").read_text()


EXPORTS = [trace.export_perfetto, trace.export_torch_snapshot]


@pytest.mark.parametrize("export", EXPORTS)
def test_an_export_of_an_empty_timeline_raises(export, tmp_path):
    with pytest.raises(ValueError, match=f"{export.__name__}: the timeline is empty"):
        export([], tmp_path / "out")


@pytest.mark.parametrize("export", EXPORTS)
def test_an_export_of_snapshots_that_tracing_did_not_record_raises(export, tmp_path):
    trace.start_trace()
    stats = trace.snapshot_trace("matmul", "forward")
    trace.end_trace()
    with pytest.raises(ValueError, match=r"snapshot 0 \(forward matmul\) has no buffers or time_ns"):
        export([stats], tmp_path / "out")


@pytest.mark.parametrize("export", EXPORTS)
def test_an_export_of_snapshots_out_of_order_raises(export, rng, tmp_path):
    timeline = mlp_step(rng)
    with pytest.raises(ValueError, match="was taken before snapshot"):
        export(timeline[::-1], tmp_path / "out")
    assert not (tmp_path / "out").exists()
