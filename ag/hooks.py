"""Watching the graph being built: every op output, as it is made (``ag.remat.capture`` and
the chain runners use this)."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from .modes import watching

_recorders: list[list] = []
_observers: list[Callable] = []


def created(output) -> None:
    """Tell every open ``record_tensors`` and ``observe_ops`` that an op made ``output``."""
    if _recorders:
        _recorders[-1].append(output)
    for observe in _observers:
        observe(output)


@contextlib.contextmanager
def observe_ops(callback: Callable) -> Iterator[None]:
    """Call ``callback(output)`` for every op output made inside the block, from inside the op:
    ``sys._getframe(3)`` in the callback is the op's own frame (``ag.remat.capture`` reads the
    op's arguments there)."""
    with watching(_observers, callback):
        yield


@contextlib.contextmanager
def record_tensors() -> Iterator[list]:
    """Collect, in order, every Tensor that an op creates inside the block (with or without grad)."""
    with watching(_recorders, []) as made:
        yield made
