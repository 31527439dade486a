"""What a rank holds: the bytes of the NumPy buffers alive now, counted by tracemalloc.

NumPy reports each data buffer to tracemalloc in its own domain (``trace.NUMPY_DOMAIN``), so the
sum over that domain is the bytes of arrays alive, exactly, without Python's own objects.
"""
from __future__ import annotations

import tracemalloc
from contextlib import contextmanager
from typing import Iterator

from ..trace import NUMPY_DOMAIN


@contextmanager
def counting() -> Iterator[None]:
    """Trace allocations inside the block (leaving a tracemalloc session the caller started running)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start(1)
    try:
        yield
    finally:
        if started:
            tracemalloc.stop()


def numpy_bytes() -> int:
    """Σ bytes of the NumPy buffers allocated since tracing started and alive now."""
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, NUMPY_DOMAIN)])
    return sum(trace.size for trace in snapshot.traces)
