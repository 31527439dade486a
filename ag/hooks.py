"""Observation is events: the engine publishes what happens, and whoever watches subscribes.

The events, and what each passes to its subscribers:

- ``"tensor created"`` (tensor): a Tensor was made, a leaf or an op's output;
- ``"op run"`` (output, call): an op made ``output`` (its ``op`` names it); ``call`` is ``(fn, *args)``,
  the op and the arguments it ran with (``()`` for an op that gave ``make_output`` none);
- ``"grad allocated"`` (tensor): a grad buffer was allocated;
- ``"step done"`` (op, name, snapshots): a backward step ran; ``snapshots`` is the list
  ``backward(trace=True)`` returns, else None;
- ``"product counted"`` (flops): a matrix product ran, 2·m·n·k FLOPs;
- ``"phase entered"`` (name) and ``"phase left"`` (name): the engine began or ended a "backward" step,
  a rematerializer a "recompute" (``scopes.phase``); outside any phase ops run in "forward";
- ``"scope entered"`` (name) and ``"scope left"`` (name): a block named by ``scopes.scope`` (``nn``'s
  "transformer layer" and "attention core") began or ended.

The engine publishes an op's events only while some block watches (``modes.config.watchers``),
so an op that nobody watches pays one test. ``trace`` and ``count_ops`` subscribe, and keep the current
phase from the phase events; the engine imports neither.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from .modes import watching

EVENTS = ("tensor created", "op run", "grad allocated", "step done", "product counted", "phase entered",
          "phase left", "scope entered", "scope left")
_subscribers: dict[str, list[Callable]] = {event: [] for event in EVENTS}


def publish(event: str, *args) -> None:
    """Call every subscriber of ``event`` with ``args``."""
    for callback in _subscribers[event]:
        callback(*args)


def subscribe(event: str, callback: Callable) -> None:
    """Call ``callback`` on every ``event`` from now on (while anything watches the engine)."""
    _subscribers_of(event).append(callback)


@contextlib.contextmanager
def subscribed(event: str, callback: Callable) -> Iterator[None]:
    """Call ``callback`` on every ``event`` inside the block, and make the engine publish meanwhile."""
    with watching(_subscribers_of(event), callback):
        yield


def _subscribers_of(event: str) -> list[Callable]:
    if event not in _subscribers:
        raise ValueError(f"hooks: no event named {event!r}; the events are {', '.join(EVENTS)}")
    return _subscribers[event]


@contextlib.contextmanager
def record_tensors() -> Iterator[list]:
    """Collect, in order, every Tensor that an op creates inside the block (with or without grad)."""
    made: list = []
    with subscribed("op run", lambda output, call: made.append(output)):
        yield made
