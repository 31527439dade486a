"""The seams: the heavy passes of the ops, by name, where the opt-in lab (``ag.lab``) plugs in.

An op calls ``KERNELS.<name>`` for each pass named here. On the classroom path a name holds
NumPy's own function (``matmul``, ``maximum``, ``multiply``, ``sum``) or the plain NumPy pass written beside
its op and registered with ``@classroom``, so stepping into it lands in the op's own file. A pass
writes into the buffer it is given, its first argument, so that it can also run on a block of rows.
``ag.lab.enable()`` puts the lab's variants in place (``swap``) and ``disable()`` puts these back
(``restore``): no op asks which path it is on.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import numpy as np

KERNELS = SimpleNamespace(matmul=np.matmul, maximum=np.maximum, multiply=np.multiply, sum=np.sum)
_CLASSROOM: dict[str, Callable] = dict(vars(KERNELS))


def classroom(name: str) -> Callable[[Callable], Callable]:
    """Register the decorated pass as the classroom's kernel ``name``."""
    def register(kernel: Callable) -> Callable:
        _CLASSROOM[name] = kernel
        setattr(KERNELS, name, kernel)
        return kernel
    return register


def classroom_kernel(name: str) -> Callable:
    """The classroom's kernel ``name``, whichever is in place now."""
    return _CLASSROOM[name]


def names() -> tuple[str, ...]:
    return tuple(sorted(_CLASSROOM))


def swap(variants: dict[str, Callable]) -> None:
    """Put ``variants`` in place of the kernels of those names."""
    unknown = sorted(set(variants) - set(_CLASSROOM))
    if unknown:
        raise KeyError(f"kernels.swap: no seam named {', '.join(unknown)}; the seams are {', '.join(names())}")
    for name, kernel in variants.items():
        setattr(KERNELS, name, kernel)


def restore() -> None:
    """Every seam back to the classroom's kernel."""
    for name, kernel in _CLASSROOM.items():
        setattr(KERNELS, name, kernel)
