"""The seams: the heavy passes of the ops, by name, where the opt-in lab (``ag.lab``) plugs in.

An op calls ``KERNELS.<name>`` for each pass named here. On the classroom path a name holds
NumPy's own function (``exp``, ``matmul``, ``maximum``, ``multiply``, ``sum``) or the plain NumPy pass written beside
its op and registered with ``@classroom``, so stepping into it lands in the op's own file. A pass
writes into the buffer it is given, its first argument, so that it can also run on a block of rows.
``CLASSROOM`` keeps the classroom's kernel of each name: ``ag.lab.seams`` swaps the lab's variants
in and puts these back, so no op asks which path it is on.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import numpy as np

KERNELS = SimpleNamespace(exp=np.exp, matmul=np.matmul, maximum=np.maximum, multiply=np.multiply, sum=np.sum)
CLASSROOM: dict[str, Callable] = dict(vars(KERNELS))


def classroom(name: str) -> Callable[[Callable], Callable]:
    """Register the decorated pass as the classroom's kernel ``name``."""
    def register(kernel: Callable) -> Callable:
        CLASSROOM[name] = kernel
        setattr(KERNELS, name, kernel)
        return kernel
    return register
