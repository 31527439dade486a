"""``capture(fn, *inputs)`` runs ``fn`` once and records every op output it makes as a ``Graph``.

Capture subscribes to the engine's events: "op run" for each output, "scope entered" and
"scope left" for the blocks ``nn`` names. It then runs the step with everything kept
(``execute``'s own code path) to measure what no plan changes: each op's transient workspace,
its hidden bytes (what making it leaves alive beside its value's buffer: its Tensor, its
backward closure, a dropout mask), the grads alive at each backward step and each step's
transient bytes.
"""
from __future__ import annotations

import tracemalloc
from typing import Any, Callable

import numpy as np

from ... import hooks
from ...modes import config
from ...tensor import Tensor, topological_sort
from ...trace import count_ops
from .execute import measure
from .graph import BackwardStep, Call, CaptureError, Graph, Node


def capture(fn: Callable[..., Tensor], *inputs) -> Graph:
    """Run ``fn(*inputs)`` once and return its graph; ``fn`` must return a scalar loss with a graph.

    The leaves' grads are left as they were: the measuring run's grads are thrown away.
    """
    recorder = _Recorder()
    owns_tracing = not tracemalloc.is_tracing()
    if owns_tracing:
        tracemalloc.start(1)
    try:
        with count_ops() as recorder.counts, hooks.subscribed("op run", recorder), \
                hooks.subscribed("scope entered", recorder.enter), hooks.subscribed("scope left", recorder.leave):
            loss = fn(*inputs)
        graph = recorder.graph(loss)
        measure(graph, clear_traces=owns_tracing)
    finally:
        if owns_tracing:
            tracemalloc.stop()
    return graph


class _Recorder:
    """The "op run" subscriber: one entry per op output, with the call the event carries; and the
    scopes' subscriber, which numbers each entry of a scope ("attention core#1": the second)."""

    def __init__(self) -> None:
        self.counts = None
        self.entries: list[tuple[Tensor, dict[str, Any]]] = []
        self.flops_seen = 0
        self.scopes: list[str] = []
        self.entered: dict[str, int] = {}

    def enter(self, name: str) -> None:
        k = self.entered.get(name, 0)
        self.entered[name] = k + 1
        self.scopes.append(f"{name}#{k}")

    def leave(self, name: str) -> None:
        if self.scopes:  # a scope entered before capture began is not on the stack
            self.scopes.pop()

    def __call__(self, output: Tensor, op_call: tuple) -> None:
        if not config.grad_enabled:
            return  # an op inside another that runs without a graph (checkpoint): the outer node owns it
        flops = int(sum(self.counts.flops.values()))
        call = _call_of(output, op_call)
        source = None
        if output.value.base is not None:  # a view of one of its arguments?
            source = next((t for t in call.tensors() if _shares(output, t)), None)
        entry = {"call": call, "flops": flops - self.flops_seen, "scope": tuple(self.scopes),
                 "bytes": int(output.nbytes), "source": source}
        self.flops_seen = flops
        self.entries.append((output, entry))

    def graph(self, loss) -> Graph:
        if not isinstance(loss, Tensor):
            raise CaptureError(f"capture: fn returned {type(loss).__name__}, expected a scalar Tensor loss")
        if loss.size != 1:
            raise CaptureError(f"capture: fn returned a tensor of shape {loss.shape}; the loss must be a scalar")
        if not loss.requires_grad:
            raise CaptureError("capture: the loss does not require grad: no input or parameter of fn has "
                               "requires_grad=True, so there is no backward to plan")
        made = {id(t): k for k, (t, _) in enumerate(self.entries)}
        if id(loss) not in made:
            raise CaptureError("capture: the loss was not made by an op inside fn")
        keep = _ancestors(made[id(loss)], self.entries, made)
        index = {old: new for new, old in enumerate(keep)}
        tensors = [self.entries[old][0] for old in keep]
        nodes, leaves, seen_leaves = [], [], set()
        for new, old in enumerate(keep):
            t, e = self.entries[old]
            deps = []
            for arg in e["call"].tensors():
                if id(arg) in made and made[id(arg)] in index:
                    d = index[made[id(arg)]]
                    if d not in deps:
                        deps.append(d)
                elif id(arg) not in made and id(arg) not in seen_leaves:
                    seen_leaves.add(id(arg))
                    leaves.append(arg)
            source = e["source"]
            view_of = index.get(made.get(id(source), -1)) if source is not None else None
            nodes.append(Node(new, t.op, tuple(t.shape), np.dtype(t.dtype), 0 if source is not None else e["bytes"],
                              0, e["flops"], tuple(deps), view_of,
                              t._backward is not None, e["scope"], e["call"]))
        position = {id(t): k for k, t in enumerate(tensors)}
        steps = _backward_steps(loss, nodes, position)
        graph = Graph(nodes, steps, leaves, index[made[id(loss)]], tensors)
        for t in tensors:  # the capture run is done with: its values and closures go (a Call keeps what it needs)
            t.value, t._backward, t._saved, t.inputs = None, None, (), ()
        return graph


def _call_of(output: Tensor, op_call: tuple) -> Call:
    """The op that made ``output`` and the arguments it ran with, as ``make_output(call=...)``
    gave them (normalised ones: a number lifted to a Tensor, a drawn dropout mask): enough to run it again."""
    if not op_call or not callable(op_call[0]):
        raise CaptureError(f"capture: op {output.op} gave make_output no call=(fn, *args), so its output "
                           "cannot be recomputed by calling it again")
    return Call(op_call[0], tuple(op_call[1:]), {})


def _shares(a: Tensor, b: Tensor) -> bool:
    return a.value is not None and b.value is not None and np.shares_memory(a.value, b.value)


def _ancestors(root: int, entries, made: dict[int, int]) -> list[int]:
    keep, stack = {root}, [root]
    while stack:
        k = stack.pop()
        for arg in entries[k][1]["call"].tensors():
            d = made.get(id(arg))
            if d is not None and d not in keep:
                keep.add(d)
                stack.append(d)
    return sorted(keep)


def _backward_steps(loss: Tensor, nodes: list[Node], position: dict[int, int]) -> list[BackwardStep]:
    """The nodes whose ``_backward`` runs, in ``backward()``'s order, with what each reads."""
    steps = []
    for t in reversed(topological_sort(loss)):
        k = position.get(id(t))
        if k is None or t._backward is None:
            continue
        reads = [position[id(s)] for s in t._saved if id(s) in position]
        if t._saves_output:
            reads.append(k)
        steps.append(BackwardStep(k, tuple(sorted(set(reads)))))
    return steps
