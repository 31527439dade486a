"""Discarding values, and bringing them back.

A tensor with a ``rematerializer`` is not a checkpoint: its value is dropped as soon as the op
that read it has run (``discard_value_if_has_rematerializer``), and recomputed, building no
graph, when a backward step needs it (``rematerialize``). ``release_unneeded`` drops what no
backward step reads at all. The engine (``ag.tensor``) calls all three.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .arrays import as_array
from .errors import GraphError
from .modes import no_grad
from .scopes import phase


def discard_value_if_has_rematerializer(tensor) -> None:
    """A tensor that can be recomputed is not a checkpoint: drop its value now."""
    ### BEGIN SOLUTION
    if tensor.rematerializer is not None:
        tensor.value = None
    ### END SOLUTION


def release_unneeded(outputs: Sequence, inputs: Sequence = ()) -> int:
    """Discard the values of the tensors between ``inputs`` and ``outputs`` that no backward
    step reads (a layer's pre-activation before a ReLU, a residual sum, ...); return the bytes freed.

    Call it when a block of forward code returns: its intermediates are out of reach then,
    and only what backward needs should stay alive. Those it keeps are marked internal, and
    backward frees each one after the last step that reads it, as it frees the graph.
    """
    stop = {id(t) for t in (*inputs, *outputs)}
    stack, released = list(outputs), 0
    while stack:
        node = stack.pop()
        for t in node.inputs:
            if id(t) in stop or t.is_leaf or not t.requires_grad:
                continue
            stop.add(id(t))
            if t._needed_by == 0 and t.value is not None:
                released += t.value.nbytes
                t.value = None
            t._internal = True  # so backward frees it after the last step that reads it
            stack.append(t)
    return released


def rematerialize(tensor, needed_by: str) -> np.ndarray:
    """Recompute a discarded value with the tensor's rematerializer, building no graph."""
    if tensor.rematerializer is None:
        raise GraphError(f"{needed_by} needs the value of {tensor.describe()}, "
                         "which was discarded and has no rematerializer")
    with no_grad(), phase("recompute"):
        value = tensor.rematerializer()
    value = value.value if hasattr(value, "requires_grad") else as_array(value)  # a Tensor, or an array
    if (value.shape, value.dtype) != (tensor.shape, tensor.dtype):
        raise GraphError(f"rematerializer of {tensor.describe()} returned shape {value.shape} "
                         f"dtype {value.dtype}, expected shape {tensor.shape} dtype {tensor.dtype}")
    return value
