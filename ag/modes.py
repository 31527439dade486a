"""Switches that change what ops do: build a graph or not, allocate grads eagerly or lazily,
and whether anything watches the engine (then it publishes its events)."""
from __future__ import annotations

import contextlib
from typing import Iterator


class _Config:
    grad_enabled = True
    eager_grads = False
    watchers = 0  # open blocks that watch the engine (trace timelines, hooks); at 0 no hook is called


config = _Config()


@contextlib.contextmanager
def _setting(name: str, value) -> Iterator[None]:
    """``config.<name>`` is ``value`` inside the block, and what it was after it (also when it raises)."""
    previous = getattr(config, name)
    setattr(config, name, value)
    try:
        yield
    finally:
        setattr(config, name, previous)


def no_grad() -> contextlib.AbstractContextManager:
    """Ops inside build no graph: outputs have ``requires_grad=False`` and nothing is saved."""
    return _setting("grad_enabled", False)


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


def eager_grads(enabled: bool = True) -> contextlib.AbstractContextManager:
    """The lecture's "before": every Tensor allocates ``grad = zeros_like(value)`` in its
    constructor, every tensor gets a gradient, and no grad is ever freed."""
    return _setting("eager_grads", enabled)
