"""Named blocks of a run, published as events. Scopes: ``nn`` names the blocks it runs ("transformer
layer", "attention core") and ``remat.capture`` files each node under the scopes it was made in,
which NeMo's modes read. Phases: the engine and the rematerializers say when "backward" or
"recompute" runs, and ``count_ops`` and tracing file what runs there (outside any, "forward")."""
from __future__ import annotations

import contextlib
from typing import Iterator

from .hooks import publish
from .modes import config


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """Name the ops run inside the block, for whoever watches (``remat.capture`` files each node
    under the scopes it was made in)."""
    publish("scope entered", name)
    try:
        yield
    finally:
        publish("scope left", name)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Run the block in phase ``name`` ("backward", "recompute", or "forward" inside either):
    publish "phase entered" and "phase left" around it, while anything watches the engine."""
    watched = config.watchers > 0  # and so a block left is published only if its entry was
    if watched:
        publish("phase entered", name)
    try:
        yield
    finally:
        if watched:
            publish("phase left", name)
