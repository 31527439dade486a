"""Named scopes: ``nn`` names the blocks it runs ("transformer layer", "attention core") and
``remat.capture`` files each node under the scopes it was made in, which NeMo's modes read."""
from __future__ import annotations

import contextlib
from typing import Iterator

from .hooks import publish


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """Name the ops run inside the block, for whoever watches (``remat.capture`` files each node
    under the scopes it was made in)."""
    publish("scope entered", name)
    try:
        yield
    finally:
        publish("scope left", name)
