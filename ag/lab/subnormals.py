"""Subnormal results of exp flushed to 0: some CPUs (an Intel Xeon among them) compute a subnormal
e^x many times as slowly as a normal one (docs/lab.md).

``exp_flushed`` is what the lab's flash tiles take for P = e^S; ``exp`` is the lab's kernel for the
ops' seam ``exp`` (the softmax family's exps), which the classroom takes as NumPy's own.
"""
from __future__ import annotations

import math

import numpy as np


def _exp_floor(t: type) -> np.floating:
    """ln(tiny) rounded down to t: e^x is a subnormal number below it."""
    x = t(math.log(np.finfo(t).tiny))
    return np.nextafter(x, t(-np.inf)) if x > math.log(np.finfo(t).tiny) else x


# e^x is a subnormal number below x = ln(tiny): -87.3 in float32, -708.4 in float64
EXP_FLOOR = {np.dtype(t): _exp_floor(t) for t in (np.float32, np.float64)}


def exp_flushed(x, lowest=None, flush_masked: bool = True):
    """e^x in x's buffer, and 0 where x <= ``EXP_FLOOR``, where e^x would be a subnormal number.
    Such an x is raised to the floor's next number and its result multiplied by 0, without a
    branch. ``lowest``, a lower bound on x's finite entries known beforehand, saves the min over x.
    With ``flush_masked=False`` an x holding -inf (a mask) is not flushed. A NaN stays NaN. Only
    NumPy's float32 and float64 arrays are flushed."""
    floor = EXP_FLOOR.get(x.dtype) if type(x) is np.ndarray else None
    if floor is None or not x.size:
        return np.exp(x, out=x)
    if lowest is None:
        lowest = np.fmin.reduce(x, axis=None)
    if not lowest <= floor or (lowest == -np.inf and not flush_masked):  # not: a NaN lowest is no flush
        return np.exp(x, out=x)
    keep = x > floor  # False for a NaN, whose product with 0 stays NaN
    np.maximum(x, np.nextafter(floor, x.dtype.type(0)), out=x)
    np.exp(x, out=x)
    x *= keep
    return x


def exp(x, out=None):
    """``np.exp(x, out=out)`` with subnormal results flushed to 0, unless x holds a -inf (a mask):
    then telling a masked entry from a small one would cost a pass of its own."""
    if type(x) is not np.ndarray:
        return np.exp(x, out=out)
    if out is None:
        out = x.copy()
    elif out is not x:
        np.copyto(out, x)
    return exp_flushed(out, flush_masked=False)
