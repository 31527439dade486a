"""The grad-handover rule: when a grad computed in a backward step may become a tensor's
``.grad`` without a copy.

The rule, once: an array may be handed over if nothing else holds it. A fresh array (not a
view of another, writeable) is handed over to the first input that takes it, never to two.
The output's own grad (or a view of it) is held by the output; it is handed over once, and
only when nothing reads it after this step: the output is not a leaf, does not retain its
grad, and grads are not eager. Anything else is copied.

``accumulate_grad`` asks ``can_own``; an op that wants to compute its input's grad in place
(``g *= mask``) asks ``grad_to_overwrite``. The engine opens one ``step`` per backward step.
"""
from __future__ import annotations

import numpy as np

from .arrays import writeable
from .modes import config


class _Step:
    """The backward step in progress: its output's grad, whether it may be donated, and what
    was handed over already."""

    def __init__(self) -> None:
        self.output_grad: np.ndarray | None = None
        self.may_donate = False
        self.handed_out: set[int] = set()


_current = _Step()


class step:
    """Open the backward step of ``node``: its grad may be donated if nothing reads it after
    the step (not a leaf, not retained, grads not eager)."""

    def __init__(self, node) -> None:
        self.output_grad = node.grad
        self.may_donate = not (node._retains_grad or node.is_leaf or config.eager_grads)

    def __enter__(self) -> None:
        _current.output_grad, _current.may_donate = self.output_grad, self.may_donate
        self.output_grad = None  # held once, so that a step that hands it on (checkpoint) can free it
        _current.handed_out.clear()

    def __exit__(self, *exc_info) -> None:
        _current.output_grad = None
        _current.handed_out.clear()


def can_own(grad: np.ndarray) -> bool:
    """Whether ``grad`` may become a tensor's ``.grad`` as it is; if so, it counts as handed over."""
    free = grad.flags.writeable if type(grad) is np.ndarray else writeable(grad)  # a NumPy array's flag, fast
    if not free or id(grad) in _current.handed_out:
        return False
    output_grad = _current.output_grad
    if output_grad is not None and (grad is output_grad or grad.base is output_grad):
        if not _current.may_donate:
            return False
        _current.may_donate = False
    elif grad.base is not None:
        return False
    _current.handed_out.add(id(grad))
    return True


def grad_to_overwrite(output) -> np.ndarray:
    """``output.grad`` itself when nothing will read it after this step, else a copy: an op may
    then compute its input's grad in place (``g *= mask``) and hand it to one input."""
    if _current.may_donate and _current.output_grad is output.grad:
        return output.grad
    return output.grad.copy()
