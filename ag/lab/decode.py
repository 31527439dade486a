"""``flash_decode``'s batch entries on the lab's threads, put into the seam ``decode_entries``: each
entry is decoded as the classroom decodes it (``attention.decode.decode_entry``), so the bits are
the classroom's for any number of workers; a step is bound by memory, and two cores read the
cache faster than one."""
from __future__ import annotations

from typing import Callable

from ..attention.flash import one_blas_thread
from . import sharing
from .threads import workers


def each_entry(entries: int, work: int, decode_one: Callable[[int], None]) -> None:
    """``decode_one(b)`` for each batch entry, thread i taking entries i, i + T, … of T threads
    (``sharing.in_turns``): as many as ``work`` multiply-adds of q Kᵀ allow (``sharing.threads_for``)
    and entries there are, BLAS held to one thread on each."""
    threads = min(sharing.threads_for(work, sharing.count(workers())), entries)
    with one_blas_thread():
        sharing.in_turns(list(range(entries)), [None] * max(threads, 1), lambda _, b: decode_one(b), hold_blas=False)
