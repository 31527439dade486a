"""The Tensor and its backward engine.

A Tensor holds a NumPy ``value``; an op builds its output Tensor, records which
Tensors it came from (``inputs``) and attaches a ``_backward`` closure that adds
into the inputs' ``grad``. ``backward()`` sorts the graph topologically (inputs
before outputs) and runs the closures in reverse, exactly as the lecture does,
with these memory rules:

1. no grad buffer is allocated in forward;
2. a grad is allocated the first time something flows into it;
3. a non-leaf tensor's grad is freed right after its own backward step;
4. nothing is computed along paths that lead to no ``requires_grad=True`` tensor;
5. leaves keep (and accumulate) their grad;
6. the graph is freed as backward walks it, so a second ``backward()`` raises.

A tensor with a ``rematerializer`` is not a checkpoint: its value is discarded as
soon as the op that consumed it has run, and recomputed when a backward step
needs it.
"""
from __future__ import annotations

import contextlib
import math
import sys
from typing import Callable, Iterator, Sequence

import numpy as np

from . import trace

Rematerializer = Callable[[], np.ndarray]


def array_module(x):
    """The module whose functions make arrays where ``x`` lives: numpy for host arrays, the
    array's own package (cupy for a ``cupy.ndarray``) for device arrays."""
    if isinstance(x, (np.ndarray, np.generic)) or not hasattr(x, "__array_function__"):
        return np
    return sys.modules.get(type(x).__module__.split(".")[0], np)


def _array(x) -> np.ndarray:
    """x as an array, left where it lives (NumPy would refuse to copy a GPU array implicitly)."""
    return x if type(x) is np.ndarray or array_module(x) is not np else np.asarray(x)


class GraphError(RuntimeError):
    """Backward cannot run: the graph was freed or a value it needs is gone."""


class _Config:
    grad_enabled = True
    eager_grads = False
    phase = "forward"  # or "backward" inside a backward step, "recompute" inside a rematerializer


config = _Config()


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Ops inside build no graph: outputs have ``requires_grad=False`` and nothing is saved."""
    previous = config.grad_enabled
    config.grad_enabled = False
    try:
        yield
    finally:
        config.grad_enabled = previous


class phase:
    """Label the ops run inside: "forward", "backward" or "recompute" (``count_ops`` and
    ``tracing`` file what runs under the label).

    A class rather than a generator: every backward step enters one, and this costs a third.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.previous, config.phase = config.phase, self.name

    def __exit__(self, *exc_info) -> None:
        config.phase = self.previous


@contextlib.contextmanager
def eager_grads(enabled: bool = True) -> Iterator[None]:
    """The lecture's "before": every Tensor allocates ``grad = zeros_like(value)`` in its
    constructor, every tensor gets a gradient, and no grad is ever freed."""
    previous = config.eager_grads
    config.eager_grads = enabled
    try:
        yield
    finally:
        config.eager_grads = previous


class Tensor:
    """A NumPy array with a gradient, a place in the graph and an optional rematerializer."""

    __array_priority__ = 1000  # so that ndarray + Tensor calls Tensor.__radd__

    # What a tensor is until an op or a call says otherwise (a leaf, outside any graph).
    op: str | None = None                        # the op that made it; None for a leaf
    inputs: tuple[Tensor, ...] = ()              # the inputs that require grad
    _backward: Callable[[Tensor], None] | None = None
    _saved: tuple[Tensor, ...] = ()              # the inputs whose values _backward reads
    _saves_output = False                        # and whether it reads the output's own value
    _retains_grad = False
    _graph_freed = False
    _needed_by = 0                               # how many backward steps still read this value

    def __init__(self, value, requires_grad: bool = False,
                 rematerializer: Rematerializer | None = None, name: str | None = None):
        self.value = value = _as_array(value, name)
        self._shape, self._dtype = value.shape, value.dtype
        floating = self._dtype.kind in "fc"
        if requires_grad and not floating:
            raise TypeError(f"Tensor {name or ''}: only floating-point tensors can require grad, "
                            f"got dtype {self._dtype}")
        self.requires_grad = bool(requires_grad) or (config.eager_grads and floating)
        self.grad = np.zeros_like(value) if config.eager_grads else None
        self.rematerializer = rematerializer
        self.name = name
        trace.watch_value(self, config.phase)
        if self.grad is not None:
            trace.watch_grad(self)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape, known even while the value is discarded."""
        return self._shape if self.value is None else self.value.shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype if self.value is None else self.value.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return 0 if self.value is None else self.value.nbytes

    @property
    def is_leaf(self) -> bool:
        return self.op is None

    def __repr__(self) -> str:
        label = f", name={self.name!r}" if self.name else ""
        grad = ", requires_grad=True" if self.requires_grad else ""
        if self.value is None:
            return f"Tensor(<discarded>{label}{grad})"
        return f"Tensor({np.array2string(self.value, threshold=20)}{grad}{label})"

    def __len__(self) -> int:
        return len(self._live_value("len"))

    def describe(self) -> str:
        """A short name for messages: the tensor's name, else the op that made it."""
        if self.name:
            return f"tensor '{self.name}'"
        return f"output of {self.op}" if self.op else "a leaf tensor"

    def retain_grad(self) -> Tensor:
        """Keep this non-leaf tensor's grad after backward instead of freeing it."""
        self._retains_grad = True
        return self

    def zero_grad(self) -> None:
        """Forget the accumulated gradient (the buffer is allocated again on the next backward)."""
        if config.eager_grads and self.value is not None:
            self.grad = np.zeros_like(self.value)
        else:
            self.grad = None

    def numpy(self) -> np.ndarray:
        return self._live_value("numpy")

    def item(self) -> float:
        return self._live_value("item").item()

    def backward(self, grad=None, *, retain_graph: bool = False, trace: bool = False):
        """Backpropagate from this tensor; with ``trace=True`` return a snapshot after each step."""
        return backward(self, grad, retain_graph=retain_graph, trace=trace)

    def _live_value(self, what: str) -> np.ndarray:
        if self.value is None:
            raise GraphError(f"{what}: the value of {self.describe()} was discarded "
                             "(rematerialization or release); it has no value to read now")
        return self.value


def _as_array(value, name: str | None) -> np.ndarray:
    if type(value) is np.ndarray and value.dtype.kind in "biufc":
        return value  # an op's result, the common case
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return np.asarray(value)  # a full reduction's scalar
    if isinstance(value, Tensor):
        raise TypeError(f"Tensor {name or ''}: value is already a Tensor; pass its .value")
    array = _array(value)
    if array.dtype.kind not in "biufc":
        raise TypeError(f"Tensor {name or ''}: value must be numeric, got dtype {array.dtype} "
                        f"from {type(value).__name__}")
    return array


def as_tensor(x, like: Tensor | None = None) -> Tensor:
    """Lift a Python number or array to a constant Tensor; a number takes ``like``'s dtype rules."""
    if isinstance(x, Tensor):
        return x
    if like is not None and isinstance(x, (int, float, bool)):
        xp = np if like.value is None else array_module(like.value)
        return Tensor(xp.asarray(x, dtype=np.result_type(like.dtype, x)))
    return Tensor(x)


def make_output(value, op: str, inputs: Sequence[Tensor], backward: Callable[[Tensor], None],
                saves: Sequence[Tensor] = (), saves_output: bool = False) -> Tensor:
    """Wrap an op's result and, if any input requires grad, attach the op's backward.

    ``saves`` lists the inputs whose ``.value`` the backward reads, ``saves_output``
    says it reads the output's own value: rematerialization restores exactly those.
    """
    output = Tensor(value)
    output.op = op
    grad_inputs = tuple([t for t in inputs if t.requires_grad]) if config.grad_enabled else ()
    if grad_inputs:
        output.requires_grad = True
        output.inputs = grad_inputs
        output._backward = backward
        output._saved = saves = tuple(saves)
        for t in saves:
            t._needed_by += 1
        if saves_output:
            output._saves_output = True
            output._needed_by += 1
    for t in inputs:
        if t.rematerializer is not None:  # a checkpoint is kept; only a recomputable input can go
            discard_value_if_has_rematerializer(t)
    if _recorders:
        _recorders[-1].append(output)
    if _observers:
        for observe in _observers:
            observe(output)
    trace.record(config.phase, op, None)  # phase is "recompute" when a rematerializer runs it
    return output


_recorders: list[list[Tensor]] = []
_observers: list[Callable[[Tensor], None]] = []


@contextlib.contextmanager
def observe_ops(callback: Callable[[Tensor], None]) -> Iterator[None]:
    """Call ``callback(output)`` for every op output made inside the block, from inside the op:
    ``sys._getframe(2)`` in the callback is the op's own frame (``ag.remat.capture`` reads the
    op's arguments there)."""
    _observers.append(callback)
    try:
        yield
    finally:
        _observers[:] = [c for c in _observers if c is not callback]


@contextlib.contextmanager
def record_tensors() -> Iterator[list[Tensor]]:
    """Collect, in order, every Tensor that an op creates inside the block (with or without grad)."""
    created: list[Tensor] = []
    _recorders.append(created)
    try:
        yield created
    finally:
        _recorders[:] = [r for r in _recorders if r is not created]  # by identity: empty lists are equal


def discard_value_if_has_rematerializer(tensor: Tensor) -> None:
    """A tensor that can be recomputed is not a checkpoint: drop its value now."""
    ### BEGIN SOLUTION
    if tensor.rematerializer is not None:
        tensor.value = None
    ### END SOLUTION


def release_unneeded(outputs: Sequence[Tensor], inputs: Sequence[Tensor] = ()) -> int:
    """Discard the values of the tensors between ``inputs`` and ``outputs`` that no backward
    step reads (a layer's pre-activation before a ReLU, a residual sum, ...); return the bytes freed.

    Call it when a block of forward code returns: its intermediates are out of reach then,
    and only what backward needs should stay alive.
    """
    stop = {id(t) for t in (*inputs, *outputs)}
    stack, released = list(outputs), 0
    while stack:
        node = stack.pop()
        for t in node.inputs:
            if id(t) in stop or t.is_leaf:
                continue
            stop.add(id(t))
            if t._needed_by == 0 and t.value is not None:
                released += t.value.nbytes
                t.value = None
            stack.append(t)
    return released


def topological_sort(root: Tensor) -> list[Tensor]:
    """Every tensor that ``root`` depends on through grad-requiring inputs, inputs first.

    Iterative depth-first search, so a chain of 50,000 ops does not hit Python's recursion limit.
    """
    order: list[Tensor] = []
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        node, inputs_done = stack.pop()
        if inputs_done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        stack.extend((t, False) for t in node.inputs if id(t) not in visited)
    return order


def backward(root: Tensor, grad=None, *, retain_graph: bool = False, trace: bool = False):
    """Run every recorded ``_backward`` closure from ``root`` down to the leaves."""
    seed = _seed_grad(root, grad)
    snapshots = [] if trace else None
    order = topological_sort(root)
    if root.grad is None:
        root.grad = seed
    else:
        root.grad += seed
    del seed  # the root's grad is freed after its step like any other
    keep_graph = retain_graph or config.eager_grads
    while order:
        label = backward_step(order.pop(), keep_graph)
        if label is not None:  # the node is gone: a value nothing else reads is freed before we measure
            _record_step(*label, snapshots)
    return snapshots


def backward_step(node: Tensor, keep_graph: bool = False) -> tuple[str, str | None] | None:
    """One step of ``backward``: run ``node``'s closure if a grad reached it, free its grad
    (rule 3) and, unless ``keep_graph``, its part of the graph. Returns (op, name) for non-leaves."""
    if node._graph_freed:
        raise GraphError(f"backward: {node.describe()} is part of a graph that an earlier "
                         "backward() freed; pass retain_graph=True to the first call")
    if node._backward is not None and node.grad is not None:
        _run_step(node)
    ### BEGIN SOLUTION
    if not (node.is_leaf or node._retains_grad or config.eager_grads):
        node.grad = None
    ### END SOLUTION
    if not keep_graph and not node.is_leaf:
        _free_graph(node)
    return None if node.op is None else (node.op, node.name)


def _seed_grad(root: Tensor, grad) -> np.ndarray:
    if root._graph_freed:
        raise GraphError(f"backward: the graph behind {root.describe()} was freed by an earlier "
                         "backward() and its intermediate values discarded; pass "
                         "retain_graph=True to the first call to backpropagate twice")
    if not root.requires_grad:
        raise GraphError(f"backward: {root.describe()} does not require grad: no tensor it "
                         "depends on was created with requires_grad=True")
    if grad is None:
        if root.size != 1:
            raise GraphError(f"backward: {root.describe()} has shape {root.shape}; backward() "
                             "without a grad argument needs a scalar (one element)")
        return np.ones_like(root.value)
    grad = array_module(root.value).asarray(grad, dtype=root.dtype).copy()
    if grad.shape != root.shape:
        raise GraphError(f"backward: grad of shape {grad.shape} does not match "
                         f"{root.describe()} of shape {root.shape}")
    return grad


def _run_step(node: Tensor) -> None:
    """One backward step: beam back the values it reads, run its closure, discard them again."""
    needed = node._saved + ((node,) if node._saves_output else ())
    if any(t.value is None for t in needed):  # something this step reads was discarded
        ### BEGIN SOLUTION
        for t in needed:
            if t.value is None:
                t.value = rematerialize(t, f"backward of {node.op}")
        ### END SOLUTION
    _step.begin(node)
    try:
        with phase("backward"):
            node._backward(node)
    finally:
        _step.end()
    for t in needed:
        t._needed_by -= 1
        if t._needed_by <= 0 and t.rematerializer is not None:  # no step left reads it; it can come back
            ### BEGIN SOLUTION
            discard_value_if_has_rematerializer(t)
            ### END SOLUTION


def rematerialize(tensor: Tensor, needed_by: str) -> np.ndarray:
    """Recompute a discarded value with the tensor's rematerializer, building no graph."""
    if tensor.rematerializer is None:
        raise GraphError(f"{needed_by} needs the value of {tensor.describe()}, "
                         "which was discarded and has no rematerializer")
    with no_grad(), phase("recompute"):
        value = tensor.rematerializer()
    value = value.value if isinstance(value, Tensor) else _array(value)
    if (value.shape, value.dtype) != (tensor._shape, tensor._dtype):
        raise GraphError(f"rematerializer of {tensor.describe()} returned shape {value.shape} "
                         f"dtype {value.dtype}, expected shape {tensor._shape} dtype {tensor._dtype}")
    return value


def _free_graph(node: Tensor) -> None:
    node._backward = None
    node.inputs = ()
    node._saved = ()
    node._graph_freed = True


def _record_step(op: str, name: str | None, snapshots: list | None) -> None:
    trace.record("backward", op, name)
    if snapshots is not None:
        snapshots.append(trace.snapshot_trace(op, "backward", name))


class _Step:
    """The backward step in progress: whose grad may be handed on without a copy."""

    def __init__(self) -> None:
        self.output_grad: np.ndarray | None = None
        self.may_donate = False
        self.handed_out: set[int] = set()

    def begin(self, node: Tensor) -> None:
        self.output_grad = node.grad
        self.may_donate = not (node._retains_grad or node.is_leaf or config.eager_grads)
        self.handed_out.clear()

    def end(self) -> None:
        self.output_grad = None
        self.handed_out.clear()

    def can_own(self, grad: np.ndarray) -> bool:
        """A grad array may become a tensor's ``.grad`` if nobody else holds it."""
        if not grad.flags.writeable or id(grad) in self.handed_out:
            return False
        og = self.output_grad
        if og is not None and (grad is og or grad.base is og):
            if not self.may_donate:
                return False
            self.may_donate = False
        elif grad.base is not None:
            return False
        self.handed_out.add(id(grad))
        return True


_step = _Step()


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the axes that broadcasting added or stretched, back to ``shape``."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(
        extra + i for i, n in enumerate(shape) if n == 1 and grad.shape[extra + i] != 1)
    summed = np.empty_like(grad, shape=shape)
    # sum straight into a fresh buffer, so the result is nobody's view and can become a .grad
    np.sum(grad, axis=axes, keepdims=True, out=summed.reshape((1,) * extra + shape))
    return summed


def grad_to_overwrite(output: Tensor) -> np.ndarray:
    """``output.grad`` itself when nothing will read it after this step, else a copy: an op may
    then compute its input's grad in place (``g *= mask``) and hand it to one input."""
    if _step.may_donate and _step.output_grad is output.grad:
        return output.grad
    return output.grad.copy()


def accumulate_grad(tensor: Tensor, grad: np.ndarray) -> None:
    """``tensor.grad += grad``, allocating the buffer the first time something flows in."""
    if not tensor.requires_grad:
        return
    grad = unbroadcast(_array(grad), tensor.shape)
    if grad.dtype != tensor.dtype:
        grad = grad.astype(tensor.dtype)
    allocating = tensor.grad is None
    ### BEGIN SOLUTION
    if tensor.grad is None:
        tensor.grad = grad if _step.can_own(grad) else grad.copy()
    else:
        tensor.grad += grad
    ### END SOLUTION
    if allocating:
        trace.watch_grad(tensor)
