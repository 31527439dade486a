"""Pipeline parallelism: a stack of L layers cut into p stages, one a rank, m micro-batches flowing through.

A schedule is data: each stage's list of actions, ("F", j) the forward of micro-batch j, ("B", j) its
backward. One executor (``run``) replays any schedule on the real ranks: a forward receives its input
from the stage before and sends its output on; a backward receives the output's grad from the stage
after and sends the input's grad back.

    GPipe (Huang et al. 2019)       F_0 .. F_{m−1}, then B_0 .. B_{m−1}: a stage holds all m micro-batches
    1F1B (Narayanan et al. 2021)    p − s − 1 warm-up forwards, then one forward, one backward, ...:
                                    stage s holds at most p − s micro-batches, whatever m is

Both leave each stage idle for (p − 1)/(m + p − 1) of the time (``memory_model.pipeline_bubble``),
measured two ways: in slots, a logical clock that every message carries (a forward costs 1 slot,
a backward 2, a stage starts an action when it and the message are both there), and in seconds.
``--work-ms w`` makes each action also wait w ms a slot (a stand-in for a large layer's compute), so that
the seconds measure the schedule rather than the messages and a busy machine.

``mpiexec -n p python -m ag.parallel.pipeline`` prints both schedules' figures per stage.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from .. import memory_model, ops
from ..tables import table
from ..tensor import Tensor
from . import held
from .mpi import Group

SCHEDULES = ("gpipe", "1f1b")
SLOTS = {"F": 1, "B": 2}  # a backward does twice a forward's matmuls


def gpipe(p: int, m: int, stage: int) -> list[tuple[str, int]]:
    """All forwards, then all backwards."""
    check_pipeline(p, m)
    return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]


def one_f_one_b(p: int, m: int, stage: int) -> list[tuple[str, int]]:
    """p − stage − 1 warm-up forwards, then alternate a forward and a backward, then the remaining backwards."""
    check_pipeline(p, m)
    warmup = p - stage - 1
    actions = [("F", j) for j in range(warmup)]
    for j in range(m - warmup):
        actions += [("F", warmup + j), ("B", j)]
    return actions + [("B", j) for j in range(m - warmup, m)]


def check_pipeline(p: int, m: int) -> None:
    """m micro-batches must at least fill the p stages."""
    if p < 1 or m < p:
        raise ValueError(f"pipeline: m={m} micro-batches for p={p} stages; expected m >= p (with fewer, "
                         f"some stage never works while all others do)")


def schedule(name: str, p: int, m: int, stage: int) -> list[tuple[str, int]]:
    if name not in SCHEDULES:
        raise ValueError(f"pipeline: schedule {name!r}; expected one of {SCHEDULES}")
    return (gpipe if name == "gpipe" else one_f_one_b)(p, m, stage)


class Stage:
    """Stage s's layers y = tanh(x W) of an L-layer stack built from one seed (every rank draws all of them)."""

    def __init__(self, group: Group, num_layers: int, h: int, seed: int = 0, work_seconds: float = 0.0) -> None:
        if num_layers % group.size:
            raise ValueError(f"pipeline: {num_layers} layers do not split into {group.size} stages; "
                             f"expected num_layers % p == 0")
        rng = np.random.default_rng(seed)
        weights = [(rng.standard_normal((h, h)) / np.sqrt(h)).astype(np.float32) for _ in range(num_layers)]
        per = num_layers // group.size
        self.weights = [Tensor(w, requires_grad=True) for w in weights[group.rank * per:(group.rank + 1) * per]]
        self.group, self.h, self.work_seconds = group, h, work_seconds
        self.first, self.last = group.rank == 0, group.rank == group.size - 1

    def forward(self, x: np.ndarray) -> tuple[Tensor, Tensor]:
        """(the stage's input as a leaf, its output): backward runs from the output down to the leaf."""
        a = Tensor(x, requires_grad=not self.first)
        out = a
        for w in self.weights:
            out = ops.tanh(ops.matmul(out, w))
        return a, out


class Clock:
    """This rank's logical clock in slots: an action starts when the rank and its message are both there."""

    def __init__(self) -> None:
        self.now = self.busy = 0

    def run(self, kind: str, ready: int) -> int:
        self.now = max(self.now, ready) + SLOTS[kind]
        self.busy += SLOTS[kind]
        return self.now


def run(stage: Stage, actions: list[tuple[str, int]], micro_batches: list[np.ndarray]) -> dict:
    """Replay ``actions`` on this rank twice: once counting the activations held after each action
    (tracemalloc) and the slots, once timing the busy seconds (tracing off, as it slows every allocation).
    Returns the peak held bytes, the bytes of one micro-batch, and the bubble's share in slots and in seconds."""
    for w in stage.weights:  # the grads accumulate over the micro-batches: made before counting, only activations count
        w.grad = np.zeros_like(w.value)
    with held.counting():
        base = held.numpy_bytes()
        held_bytes, clock, _ = replay(stage, actions, micro_batches, lambda: held.numpy_bytes() - base)
    _, _, busy = replay(stage, actions, micro_batches)
    comm, MAX = stage.group.comm, stage.group.MPI.MAX
    makespan, wall = comm.allreduce(clock.now, op=MAX), comm.allreduce(busy["wall"], op=MAX)
    return {"stage": stage.group.rank, "peak_bytes": max(held_bytes), "one_micro_batch": held_bytes[0],
            "bubble_slots": 1 - clock.busy / makespan, "bubble_seconds": 1 - busy["busy"] / wall}


def replay(stage: Stage, actions: list[tuple[str, int]], micro_batches: list[np.ndarray], held_now=None):
    """Run the actions in order: (``held_now()`` after each, the slot clock, {"busy", "wall"} seconds).
    Sends are buffered (MPI_Bsend), so a stage sending its forward never waits for one sending a grad back."""
    group, clock, in_flight, held_bytes, busy = stage.group, Clock(), {}, [], 0.0
    group.MPI.Attach_buffer(bytearray(2 * len(actions) * (micro_batches[0].nbytes + 256 + group.MPI.BSEND_OVERHEAD)))
    group.comm.Barrier()
    start = time.perf_counter()
    for kind, j in actions:
        message, ready = receive(stage, kind, j, micro_batches)
        began = time.perf_counter()
        value = step(stage, kind, j, message, in_flight)
        busy += time.perf_counter() - began
        send(stage, kind, j, value, clock.run(kind, ready))
        message = value = None  # sent: a grad or a received buffer is not an activation
        if held_now is not None:
            held_bytes.append(held_now())
    wall = time.perf_counter() - start
    group.MPI.Detach_buffer()  # waits until every buffered message is delivered
    return held_bytes, clock, {"busy": busy, "wall": wall}


def step(stage: Stage, kind: str, j: int, message: np.ndarray, in_flight: dict) -> np.ndarray | None:
    """One action: F_j keeps (input, output) and returns the output; B_j runs backward and returns the input's grad.
    Each also waits its slots' worth of ``stage.work_seconds`` (sleeping: the other ranks keep the cores)."""
    time.sleep(SLOTS[kind] * stage.work_seconds)
    if kind == "F":
        a, out = in_flight[j] = stage.forward(message)
        return out.value
    a, out = in_flight.pop(j)
    if stage.last:  # the loss ½Σy², so the output's grad is y itself
        message = out.value
    out.backward(message)
    return a.grad


def receive(stage: Stage, kind: str, j: int, micro_batches: list[np.ndarray]) -> tuple[np.ndarray | None, int]:
    """(the message, the slot it was sent at): an input from the stage before, a grad from the stage after."""
    source = stage.group.rank - 1 if kind == "F" else stage.group.rank + 1
    if (kind == "F" and stage.first) or (kind == "B" and stage.last):
        return (micro_batches[j].copy() if kind == "F" else None), 0
    buffer = np.empty(micro_batches[j].shape, dtype=np.float32)
    stage.group.comm.Recv(buffer, source=source, tag=j)
    return buffer, stage.group.comm.recv(source=source, tag=j)


def send(stage: Stage, kind: str, j: int, value: np.ndarray | None, slot: int) -> None:
    """An output to the stage after, a grad to the stage before, with the slot it is ready at."""
    if (kind == "F" and stage.last) or (kind == "B" and stage.first):
        return
    dest = stage.group.rank + 1 if kind == "F" else stage.group.rank - 1
    stage.group.comm.Bsend(np.ascontiguousarray(value), dest=dest, tag=j)
    stage.group.comm.bsend(slot, dest=dest, tag=j)


def main(argv: list[str] | None = None) -> int:
    """``mpiexec -n p python -m ag.parallel.pipeline``: per stage, GPipe's and 1F1B's held activations and bubble."""
    parser = argparse.ArgumentParser(prog="python -m ag.parallel.pipeline", description=main.__doc__)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--layers-per-stage", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--rows", type=int, default=64, help="rows of a micro-batch")
    parser.add_argument("--work-ms", type=float, default=0.0, help="milliseconds each slot of work also waits")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on rank 0")
    args = parser.parse_args(argv)
    group = Group()
    p, rows = group.size, []
    for m in args.micro_batches:
        rng = np.random.default_rng(m)
        micro_batches = [rng.standard_normal((args.rows, args.hidden)).astype(np.float32) for _ in range(m)]
        for name in SCHEDULES:
            stage = Stage(group, args.layers_per_stage * p, args.hidden, work_seconds=args.work_ms / 1e3)
            result = run(stage, schedule(name, p, m, group.rank), micro_batches)
            every = group.comm.gather(result, root=0)
            if group.rank == 0:
                rows.append({"schedule": name, "p": p, "m": m, "stages": every,
                             "bubble_formula": float(memory_model.pipeline_bubble(p, m))})
    if group.rank == 0:
        print(json.dumps({"ranks": p, "rows": rows}) if args.json else "", end="\n" if args.json else "")
        if not args.json:
            _print_rows(rows)
    return 0


def _print_rows(rows: list[dict]) -> None:
    print("per stage: micro-batches of activations held at the peak (tracemalloc), and the bubble's share")
    cells = []
    for r in rows:
        for s in r["stages"]:
            held_mb = s["peak_bytes"] / s["one_micro_batch"]
            want = memory_model.micro_batches_in_flight(r["schedule"], r["p"], r["m"], s["stage"])
            cells.append([r["schedule"], r["p"], r["m"], s["stage"], f"{held_mb:g}", want,
                          f"{s['bubble_slots']:.3f}", f"{s['bubble_seconds']:.3f}", f"{r['bubble_formula']:.3f}"])
    table(["schedule", "p", "m", "stage", "held (micro-batches)", "formula", "bubble, slots", "bubble, seconds",
           "(p−1)/(m+p−1)"], cells)


if __name__ == "__main__":
    sys.exit(main())
