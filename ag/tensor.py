"""The Tensor and its backward engine.

A Tensor holds a NumPy ``value``; an op computes its output's value, then defines a
``_backward(out, saved)`` closure that reads ``out.grad`` and the values the op saved for it
(``saves=``, and nothing else) and returns its inputs' grads, one for each input in order
(None where none is needed); ``make_output`` wraps both. ``backward()`` sorts the graph
topologically (inputs before outputs), runs the closures in reverse and adds each returned grad
into its input's ``grad``, exactly as the lecture does, with these memory rules:

1. no grad buffer is allocated in forward;
2. a grad is allocated the first time something flows into it;
3. a non-leaf tensor's grad is freed right after its own backward step;
4. nothing is computed along paths that lead to no ``requires_grad=True`` tensor;
5. leaves keep (and accumulate) their grad;
6. the graph is freed as backward walks it, so a second ``backward()`` raises; a value
   made inside a block that ``release_unneeded`` closed goes after the last step that reads it;
7. a value no backward step reads is freed once nothing but the graph holds its tensor (as in
   torch, ``relu(h @ w + b)`` keeps only the relu's output);
8. a returned grad becomes ``.grad`` without a copy when nothing else holds it: a fresh array,
   or the output's own grad when nothing reads that after the step; any other is copied.

A tensor with a ``rematerializer`` is not a checkpoint: its value is discarded as
soon as the op that consumed it has run, and recomputed when a backward step
needs it (``ag.discard``).
"""
from __future__ import annotations

import sys
from typing import Callable, Sequence

import numpy as np

from . import hooks
from .arrays import array_module, as_array, is_bfloat16, numeric_array, unbroadcast, writeable
from .discard import discard_value_if_has_rematerializer, rematerialize
from .errors import GraphError
from .modes import config
from .scopes import phase
from .tensor_base import TensorBase

Rematerializer = Callable[[], np.ndarray]


class Tensor(TensorBase):
    """A NumPy array with a gradient, a place in the graph and an optional rematerializer
    (its sizes, printing and ``.numpy()`` are ``TensorBase``'s, in ``tensor_base.py``)."""

    __array_priority__ = 1000  # so that ndarray + Tensor calls Tensor.__radd__

    # A fixed set of fields, without a per-tensor dict: CPython re-specializes attribute access
    # each time a dict-backed class gains a field.
    __slots__ = ("value", "shape", "dtype", "requires_grad", "grad", "rematerializer", "name",
                 "op", "inputs", "_backward", "_saved", "_saves_output", "_retains_grad",
                 "_graph_freed", "_needed_by", "_internal", "__weakref__")

    def __init__(self, value, requires_grad: bool = False,
                 rematerializer: Rematerializer | None = None, name: str | None = None):
        if type(value) is not np.ndarray or value.dtype.kind not in "biufc":  # not an op's plain result
            value = numeric_array(value, name)
        self.value = value
        self.shape, self.dtype = value.shape, value.dtype  # fixed, and known while the value is discarded
        self.rematerializer = rematerializer
        self.name = name
        self.requires_grad = False
        self.grad = None
        # what a tensor is until an op or a call says otherwise (a leaf, outside any graph)
        self.op: str | None = None              # the op that made it; None for a leaf
        self.inputs: tuple[Tensor, ...] = ()    # the inputs that require grad
        self._backward: Backward | None = None
        self._saved: tuple[Tensor, ...] = ()    # the inputs whose values _backward reads
        self._saves_output = False              # and whether it reads the output's own value
        self._retains_grad = False
        self._graph_freed = False
        self._needed_by = 0                     # how many backward steps still read this value
        self._internal = False                  # made inside a block release_unneeded closed
        if config.watchers:
            hooks.publish("tensor created", self)  # first: an eager grad takes the number its value got
        if requires_grad or config.eager_grads:
            self._start_grad(requires_grad)

    def _start_grad(self, requires_grad: bool) -> None:
        """requires_grad for a floating-point tensor (an error for any other), and under
        ``eager_grads`` a zero grad buffer for every tensor."""
        floating = self.dtype.kind in "fc" or is_bfloat16(self.dtype)
        if requires_grad and not floating:
            raise TypeError(f"Tensor {self.name or ''}: only floating-point tensors can require grad, "
                            f"got dtype {self.dtype}")
        self.requires_grad = bool(requires_grad) or floating
        if config.eager_grads:  # the lecture's "before": a grad buffer for every tensor, at birth
            self.grad = np.zeros_like(self.value)
            hooks.publish("grad allocated", self)

    @property
    def is_leaf(self) -> bool:
        return self.op is None

    def retain_grad(self) -> Tensor:
        """Keep this non-leaf tensor's grad after backward instead of freeing it."""
        self._retains_grad = True
        return self

    def zero_grad(self) -> None:
        """Forget the accumulated gradient (the buffer is allocated again on the next backward)."""
        self.grad = np.zeros_like(self.value) if config.eager_grads and self.value is not None else None

    def backward(self, grad=None, *, retain_graph: bool = False, trace: bool = False):
        """Backpropagate from this tensor; with ``trace=True`` return a snapshot after each step."""
        return backward(self, grad, retain_graph=retain_graph, trace=trace)


class Saved:
    """What a backward step may read: the values its op declared (``saves=``, and the output's
    own with ``saves_output=True``). ``saved[t]`` is ``t``'s value; any other tensor is an error.
    ``saved.writable_grad()`` is the output's grad for the step to compute its input's grad in."""

    __slots__ = ("output", "tensors")

    def __init__(self, output: Tensor, tensors: tuple[Tensor, ...]) -> None:
        self.output, self.tensors = output, tensors

    def __getitem__(self, tensor: Tensor) -> np.ndarray:
        for t in self.tensors:
            if t is tensor:
                return t.value
        raise GraphError(f"backward of {self.output.op} reads the value of {tensor.describe()}, which its "
                         "forward did not save: declare it in make_output(saves=...), or "
                         "saves_output=True for the output")

    def writable_grad(self) -> np.ndarray:
        """The output's grad itself when nothing reads it after this step, else a copy: an op may
        compute its input's grad in it (``g *= mask``) and return it, with no second buffer."""
        grad = self.output.grad
        return grad if _grad_freed_after_its_step(self.output) else grad.copy()


Grads = Sequence[np.ndarray | None]
Backward = Callable[[Tensor, Saved], Grads]


def make_output(value, op: str, inputs: Sequence[Tensor], backward: Backward,
                saves: Sequence[Tensor] = (), saves_output: bool = False, call: tuple = ()) -> Tensor:
    """Wrap an op's result and, if any input requires grad, attach the op's backward.

    ``backward(output, saved)`` returns one grad for each of ``inputs``, in order (None for an
    input that needs none). ``saves`` lists the inputs whose values it reads, ``saves_output``
    says it reads the output's own value: ``saved`` holds exactly those, and rematerialization
    restores exactly those. ``call`` is ``(fn, *args)``, the op and the arguments it ran with
    (``fn(*args)`` makes the output again), passed on to the "op run" event's subscribers.
    """
    output = Tensor(value)
    output.op = op
    if config.grad_enabled:
        for t in inputs:
            if t.requires_grad:  # a loop, not any(): no generator on every op's path
                _attach(output, tuple(inputs), backward, tuple(saves), saves_output)
                break
    for t in inputs:
        if t.rematerializer is not None:  # a checkpoint is kept; only a recomputable input can go
            discard_value_if_has_rematerializer(t)
        if t.inputs:
            _free_values_only_the_graph_holds(t)
    if config.watchers:  # a trace timeline, record_tensors, capture or count_ops is open
        hooks.publish("op run", output, call)
    return output


def _attach(output: Tensor, inputs: tuple[Tensor, ...], backward: Backward,
            saves: tuple[Tensor, ...], saves_output: bool) -> None:
    """Put ``output`` in the graph: its inputs, its backward and the values that reads."""
    output.requires_grad = True
    output.inputs = inputs
    output._backward = backward
    output._saved = saves
    for t in saves:
        t._needed_by += 1
    if saves_output:
        output._saves_output = True
        output._needed_by += 1


def _free_values_only_the_graph_holds(tensor: Tensor) -> None:
    """Free the value of each op output among ``tensor``'s inputs that no backward step reads,
    once nothing but ``tensor``'s place in the graph holds it: the user dropped it, as the
    temporary ``h @ w`` in ``relu(h @ w + b)`` (torch frees it then too). One that another op
    also holds is kept."""
    for t in tensor.inputs:
        # tensor's references to t, this loop's variable and getrefcount's own argument
        if (t._needed_by == 0 and t.value is not None and t.op is not None
                and sys.getrefcount(t) == _references(tensor, t) + 2):
            t.value = None


def _references(node: Tensor, t: Tensor) -> int:
    """How many references ``node``'s place in the graph holds to ``t``: in its inputs and in its
    closure's cells."""
    count = sum(x is t for x in node.inputs)
    for cell in node._backward.__closure__ or ():
        try:
            count += cell.cell_contents is t
        except ValueError:  # a cell of a variable not bound yet holds nothing
            continue
    return count


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
        stack.extend((t, False) for t in node.inputs if t.requires_grad and id(t) not in visited)
    return order


def backward(root: Tensor, grad=None, *, retain_graph: bool = False, trace: bool = False):
    """Run every recorded ``_backward`` closure from ``root`` down to the leaves; with
    ``trace=True`` return a snapshot after each step (``ag.trace`` takes them)."""
    seed = _seed_grad(root, grad)
    if root.grad is None:
        root.grad = seed
    else:
        root.grad += seed
    del seed  # the root's grad is freed after its step like any other
    return backward_from_grad(root, retain_graph=retain_graph, trace=trace)


def backward_from_grad(root: Tensor, *, retain_graph: bool = False, trace: bool = False):
    """``backward`` from a root whose grad is in place already: ``checkpoint`` hands its output's
    grad to the rerun block this way, so that no copy of it outlives the rerun's first step."""
    snapshots = [] if trace else None
    order = topological_sort(root)
    keep_graph = retain_graph or config.eager_grads
    while order:
        label = backward_step(order.pop(), keep_graph)
        if label is not None and (config.watchers or trace):  # the node is gone: measured without it
            hooks.publish("step done", *label, snapshots)
    return snapshots


def backward_step(node: Tensor, keep_graph: bool = False) -> tuple[str, str | None] | None:
    """One step of ``backward``: run ``node``'s closure if a grad reached it and add the grads it
    returns into its inputs, free its grad (rule 3) and, unless ``keep_graph``, its part of the
    graph. Returns (op, name) for non-leaves."""
    if node._graph_freed:
        raise GraphError(f"backward: {node.describe()} is part of a graph that an earlier "
                         "backward() freed; pass retain_graph=True to the first call")
    if node._backward is not None and node.grad is not None:
        incoming = id(node.grad)  # an id, not the array: a step that hands the grad on (checkpoint) frees it
        pass_grads(node, _run_step(node), incoming)
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
    xp = np if type(root.value) is np.ndarray else array_module(root.value)  # CuPy for a GPU array
    grad = xp.asarray(grad, dtype=root.dtype).copy()
    if grad.shape != root.shape:
        raise GraphError(f"backward: grad of shape {grad.shape} does not match "
                         f"{root.describe()} of shape {root.shape}")
    return grad


def _run_step(node: Tensor) -> Grads:
    """One backward step: beam back the values it reads, run its closure on them, discard them
    again; returns the grads the closure computed."""
    needed = node._saved + ((node,) if node._saves_output else ())
    if any(t.value is None for t in needed):  # something this step reads was discarded
        ### BEGIN SOLUTION
        for t in needed:
            if t.value is None:
                t.value = rematerialize(t, f"backward of {node.op}")
        ### END SOLUTION
    grads = call_backward(node, needed)
    for t in needed:
        t._needed_by -= 1
        if t.rematerializer is not None:  # only a value that can come back may go
            ### BEGIN SOLUTION
            if t._needed_by <= 0:  # no step left reads it
                discard_value_if_has_rematerializer(t)
            ### END SOLUTION
    return grads


def call_backward(node: Tensor, needed: tuple[Tensor, ...]) -> Grads:
    """``node``'s closure on the values it reads, in the phase "backward" for whoever watches
    (``count_ops`` and tracing file what runs there); unwatched, stepping in lands in the op's closure."""
    if not config.watchers:
        return node._backward(node, Saved(node, needed))
    with phase("backward"):
        return node._backward(node, Saved(node, needed))


def _grad_freed_after_its_step(node: Tensor) -> bool:
    """Whether rule 3 frees ``node``'s grad after its step: then nothing reads it after the step."""
    return not (node.is_leaf or node._retains_grad or config.eager_grads)


def pass_grads(node: Tensor, grads: Grads, incoming: int) -> None:
    """Add each grad ``node``'s step returned into its input's ``.grad``. One that nothing else
    holds becomes the grad without a copy (rule 8): a fresh array, each once, or the step's
    incoming grad (id ``incoming``, or a view of it) once, when nothing reads it after the step."""
    if grads is None:  # a closure that added into its inputs' grads itself (accumulate_grad copies)
        return
    if len(grads) != len(node.inputs):
        raise GraphError(f"backward of {node.op} returned {len(grads)} grads for its "
                         f"{len(node.inputs)} inputs: one for each input, None where none is needed")
    handed_over: set[int] = set()
    incoming_is_free = _grad_freed_after_its_step(node)
    for t, grad in zip(node.inputs, grads):
        if grad is None or not t.requires_grad:
            continue
        grad = _shaped_like(t, grad)
        if id(grad) == incoming or (grad.base is not None and id(grad.base) == incoming):
            key = incoming if incoming_is_free else None
        else:
            key = id(grad) if grad.base is None else None  # a view of another array is not its own
        free = grad.flags.writeable if type(grad) is np.ndarray else writeable(grad)  # NumPy's flag, fast
        owned = key is not None and key not in handed_over and free
        if owned:
            handed_over.add(key)
        accumulate_grad(t, grad, owned)


def _free_graph(node: Tensor) -> None:
    for t in node._saved + ((node,) if node._saves_output else ()):
        if t._internal and t._needed_by <= 0:  # out of the user's reach, and no step left reads it
            t.value = None
    node._backward = None
    node.inputs = ()
    node._saved = ()
    node._graph_freed = True


def accumulate_grad(tensor: Tensor, grad: np.ndarray, owned: bool = False) -> None:
    """``tensor.grad += grad``, allocating the buffer the first time something flows in; an
    ``owned`` grad (an array nothing else holds) becomes the buffer itself, any other is copied."""
    if not tensor.requires_grad:
        return
    grad = _shaped_like(tensor, grad)
    first_flow = tensor.grad is None
    ### BEGIN SOLUTION
    if tensor.grad is None:
        tensor.grad = grad if owned else grad.copy()
    else:
        tensor.grad += grad
    ### END SOLUTION
    if first_flow and config.watchers:
        hooks.publish("grad allocated", tensor)  # tracing files the new buffer under "gradients"


def _shaped_like(tensor: Tensor, grad) -> np.ndarray:
    """``grad`` as an array of ``tensor``'s shape (summed over broadcast axes) and dtype."""
    if type(grad) is not np.ndarray:
        grad = as_array(grad)
    if grad.shape != tensor.shape:
        grad = unbroadcast(grad, tensor.shape)
    return grad if grad.dtype == tensor.dtype else grad.astype(tensor.dtype)
