"""``flash_decode``'s batch entries on the lab's threads, put into the seam ``decode_entries``: each
entry is decoded as the classroom decodes it (``attention.decode.decode_entry``), so the bits are
the classroom's for any number of workers; a step is bound by memory, and two cores read the
cache faster than one."""
from __future__ import annotations

from typing import Callable

from . import sharing
from .threads import workers


def each_entry(entries: int, work: int, decode_one: Callable[[int], None]) -> None:
    """``decode_one(b)`` for each batch entry, thread i taking entries i, i + T, … of T threads
    (``sharing.on_threads``): as many as ``work`` multiply-adds of q Kᵀ allow (``sharing.threads_for``)
    and entries there are, BLAS held to one thread on each."""
    sharing.on_threads(list(range(entries)), sharing.threads_for(work, sharing.count(workers())), decode_one)
