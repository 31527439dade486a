"""Checks for graded tests: they run in the judge, on data a probe returned, and fail with a
Markdown message that puts what was expected beside what the student's code gave.

Each check first makes sure the data is what it claims to be (an array of the right shape, a
list of ints), so a probe's result can never pass by being an odd object. Whatever came from
the student is shown as code (``code``, ``fenced``), so it can never render as Markdown.
"""
from __future__ import annotations

import re
import reprlib

import numpy as np

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict, _REPR.maxlevel = 120, 120, 12, 8, 3


def code(text: str, limit: int = 200) -> str:
    """``text`` as one inline code span that nothing in it can close (its own backticks, a blank line)."""
    text = " ".join(str(text)[:limit].split())
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}"


def fenced(text: str) -> str:
    """``text`` as a fenced code block that nothing in it can close."""
    fence = "`" * max(3, max(map(len, re.findall("`+", text)), default=0) + 1)
    return f"{fence}text\n{text}\n{fence}"


def expect_close(got, want, *, what: str, rtol: float = 1e-7, atol: float = 0.0) -> None:
    """``got`` equals the reference ``want`` elementwise within ``atol + rtol·|want|``, NaNs nowhere."""
    want = np.asarray(want)
    if type(got) is not np.ndarray or got.dtype.kind not in "biuf":
        raise AssertionError(f"**{what}**: expected an array of numbers of shape {want.shape}, "
                             f"got {_kind(got)}")
    if got.shape != want.shape:
        raise AssertionError(f"**{what}**: expected shape {code(want.shape)}, got shape {code(got.shape)}")
    bad = ~(np.abs(got.astype(np.float64) - want) <= atol + rtol * np.abs(want))
    if bad.any():
        at = np.unravel_index(np.argmax(bad), bad.shape)
        index = tuple(int(i) for i in at)
        raise AssertionError(
            f"**{what}** differs from the reference in {int(bad.sum())} of {bad.size} elements "
            f"(tolerance: atol = {atol:g}, rtol = {rtol:g}).\n\n"
            f"| at index | expected | got |\n|---|---|---|\n| {code(index)} | {code(f'{want[at]:.10g}')} | "
            f"{code(f'{got[at]:.10g}')} |")


def expect_equal(got, want, *, what: str) -> None:
    """``got`` is exactly ``want``: the same plain value, or an array of the same shape and values."""
    if isinstance(want, np.ndarray):
        if type(got) is not np.ndarray or got.shape != want.shape or not np.array_equal(got, want):
            raise AssertionError(f"**{what}**: expected {code(_short(want))}, got {code(_short(got))}")
        return
    if type(got) is not type(want) or got != want:
        raise AssertionError(f"**{what}**: expected {code(_short(want))}, got {code(_short(got))}")


def expect_true(condition: bool, message: str) -> None:
    """A check stated as a sentence: ``message`` says what was expected and what came instead."""
    if condition is not True:
        raise AssertionError(message)


def _kind(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    return f"{code(_short(value))} ({code(type(value).__name__)})"


def _short(value) -> str:
    """A bounded repr: a reply can hold a list of a million numbers."""
    return np.array2string(value, threshold=20) if isinstance(value, np.ndarray) else _REPR.repr(value)
