"""The marked regions of ag's source: where a solution begins and ends, and cutting it out.

The parts students write are marked in the library with ``### BEGIN SOLUTION`` /
``### END SOLUTION`` (nbgrader's markers). Every station that reads them (assign, install,
the notebooks) takes these few functions from here.
"""
from __future__ import annotations

import ast
import importlib

from .exercises import PACKAGE

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
STUBBED_MODULE = "_stubbed"  # ag/_stubbed.py, written only into generated copies of ag


def function_source(module: str, name: str) -> str:
    """The source of ``ag.<module>.<name>``, read from the file (decorators included)."""
    text = (PACKAGE / f"{module.replace('.', '/')}.py").read_text()  # "remat.chains.plans" is ag/remat/chains/plans.py
    lines = text.splitlines()
    for found, start, last in top_level_spans(text):
        if found == name:
            stop = last + 1
            while stop < len(lines) and lines[stop].strip() == END:  # a region closing the function
                stop += 1
            return "\n".join(lines[start:stop]) + "\n"
    raise LookupError(f"assign: no function {name!r} in ag/{module}.py")


def cut_solutions(source: str, *, keep: bool) -> str:
    """Drop the markers; with ``keep=False`` also replace each marked region by the stub."""
    lines = source.splitlines()
    regions = marked_regions(lines)
    return "\n".join(cut(lines, regions, [None if keep else STUB] * len(regions))) + "\n"


def marked_regions(lines: list[str]) -> list[tuple[int, int]]:
    """The (BEGIN, END) line indexes of every marked region, checking that the markers pair up."""
    regions, begin = [], None
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped == BEGIN:
            if begin is not None:
                raise ValueError(f"line {index + 1}: {BEGIN} inside another solution region")
            begin = index
        elif stripped == END:
            if begin is None:
                raise ValueError(f"line {index + 1}: {END} without {BEGIN}")
            regions.append((begin, index))
            begin = None
    if begin is not None:
        raise ValueError(f"line {begin + 1}: {BEGIN} is never closed")
    return regions


def cut(lines: list[str], regions: list[tuple[int, int]], stubs: list[tuple[str, ...] | None]) -> list[str]:
    """The lines without markers; each region with lines in ``stubs`` becomes them, at its indent."""
    out, previous = [], 0
    for (begin, end), stub in zip(regions, stubs):
        out.extend(lines[previous:begin])
        if stub:
            indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
            out.extend(indent + s for s in stub)
        else:
            out.extend(lines[begin + 1:end])
        previous = end + 1
    out.extend(lines[previous:])
    return out


def stubbed() -> frozenset[int]:
    """The exercises whose functions are stubs in the imported ag: none in the source, all in the release."""
    name = f"{__name__.partition('.')[0]}.{STUBBED_MODULE}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name:
            raise
        return frozenset()
    return frozenset(module.STUBBED)


def top_level_spans(text: str) -> list[tuple[str, int, int]]:
    """(name, first line index, last line index) of each top-level def and class, decorators included."""
    return [(node.name, min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1, node.end_lineno - 1)
            for node in ast.parse(text).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
