"""The opt-in lab: what it takes to reach torch from NumPy, kept out of the classroom's code.

The classroom path, the default, is the lecture's code: a product is one ``np.matmul``, a pass
one NumPy call over the whole array. The lab puts its variants into the ops' seams
(``ag.ops.kernels``) and takes them out again (``seams``), never editing an op:

- ``products``: a large product cut into blocks of rows or matrices, one BLAS call a step on one
  BLAS thread, the blocks dealt to the lab's threads;
- ``passes``: large elementwise and row-wise passes (relu, gelu, layer_norm, the softmaxes,
  dropout's mask) shared among those threads, and a short vector's sum as one BLAS dot;
- ``subnormals``: exp with its subnormal results flushed to 0, for the softmax family's passes;
- ``threads``: the pool that runs the blocks, and ``set_workers``;
- ``flash``, ``flash_loops``, ``flash_tiles``, ``sharing``: ``flash_attention`` on NumPy with a fixed
  shift, exp2, subnormals flushed and one call's heads shared among the threads; ``flash_variants``:
  its variants (a window, softcap, ALiBi, dropout) on the threads, with the classroom's bits;
- ``decode``: ``flash_decode``'s batch entries shared among the threads.

The results are bit-identical for any number of workers. One switch, three ways: ``enable()`` and
``disable()``, ``with on(): ...``, or ``AG_LAB=1`` in the environment when ag is imported.
docs/lab.md gives each trick with its measured gain.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

from ..ops import kernels
from . import decode, flash, passes, products, seams, threads
from .threads import set_workers, workers

__all__ = ["enable", "disable", "enabled", "on", "set_workers", "workers"]


def enable() -> None:
    """Put the lab's variants into the ops' seams, for the whole process."""
    seams.swap({"matmul": products.matmul, "flash_passes": flash.passes, "decode_entries": decode.each_entry,
                **passes.variants()})


def disable() -> None:
    """Back to the classroom path: every seam holds the classroom's kernel."""
    seams.restore()


def enabled() -> bool:
    return kernels.KERNELS.matmul is products.matmul


@contextlib.contextmanager
def on() -> Iterator[None]:
    """The lab on inside the block; as it was before after it."""
    was = enabled()
    enable()
    try:
        yield
    finally:
        if not was:
            disable()


def _from_environment(value: str | None) -> None:
    """``AG_LAB=1`` switches the lab on, ``0`` or unset leaves it off; anything else is an error."""
    if value == "1":
        enable()
    elif value not in (None, "", "0"):
        raise ValueError(f"AG_LAB must be 1 (the lab on) or 0 (off), got {value!r}")


_from_environment(os.environ.get("AG_LAB"))
