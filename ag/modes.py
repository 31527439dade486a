"""Switches that change what ops do: build a graph or not, allocate grads eagerly or lazily,
and the phase label ("forward", "backward", "recompute") under which ops are counted and traced."""
from __future__ import annotations

import contextlib
from typing import Iterator


class _Config:
    grad_enabled = True
    eager_grads = False
    phase = "forward"  # or "backward" inside a backward step, "recompute" inside a rematerializer
    watchers = 0  # open blocks that watch the engine (trace timelines, hooks); at 0 no hook is called


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


@contextlib.contextmanager
def watching(registry: list, watcher) -> Iterator:
    """Put ``watcher`` (a trace timeline, a ``record_tensors`` list, an event's subscriber, a
    ``count_ops`` count) in ``registry`` for the block, and count the block in ``config.watchers``:
    only while one is open does the engine call the hooks, 0.1 µs an op otherwise. The watcher leaves
    by identity (empty lists are equal), also when the block raises."""
    registry.append(watcher)
    config.watchers += 1
    try:
        yield watcher
    finally:
        config.watchers -= 1
        registry[:] = [w for w in registry if w is not watcher]


class phase:
    """Label the ops run inside: "forward", "backward" or "recompute" (``count_ops`` and
    ``tracing`` file what runs under the label).

    A class rather than a generator: every backward step enters one, and a generator costs a third.
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
