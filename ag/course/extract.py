"""A student's notebook, turned into exercise files: its imports and definitions, never its demo cells.

A notebook is student data, read defensively: invalid JSON, JSON nested too deeply, a cell that is
not an object, a ``source`` that is not text, a code cell that is not Python, each raise
NotebookError with a sentence that names the notebook, so a bad notebook costs only its own
exercises (see ``intake``).
"""
from __future__ import annotations

import ast
import json
import re

from .exercises import EXERCISES

# IPython lines that are not Python: %magic, !shell, ?help, help?, x = !shell, x = %magic
MAGIC = re.compile(r"^\s*([%!?]|[\w.]+\?\??\s*$|[\w.,\s]+=\s*[%!])")
# characters of code an upload's notebooks may hold, all cells together: the parser needs up to ~700 times
# that in memory, and a second for 256 KB, in the grader's own process (the course's solutions are 27 KB)
MAX_CODE = 256 * 1024
# JSON objects and arrays a notebook may open: each costs ~80 bytes once read, in the grader's own process
MAX_CONTAINERS = 500_000
# a line as the parser numbers them: \r\n, \r and \n end one (str.splitlines also splits at \f, \x1c, ...)
LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
# what a plain top-level constant may be built from: no calls, subscripts or comprehensions
CONSTANT_NODES = (ast.Constant, ast.Name, ast.Attribute, ast.Load, ast.BinOp, ast.UnaryOp, ast.operator,
                  ast.unaryop, ast.Tuple, ast.List, ast.Set, ast.Dict)


class NotebookError(ValueError):
    """A notebook that is not valid JSON, not nbformat 4, or holds a code cell that is not Python."""


def exercise_files(name: str, data: bytes) -> dict[str, str]:
    """``{exN_name.py: source}`` for every exercise whose functions the notebook all defines.

    Each source is the notebook's top-level imports and definitions (functions, classes, plain
    constants) in cell order; expression statements and calls, the demo cells, are left out.
    ``name`` is how messages call the notebook (the student's own name for it, already escaped).
    """
    return from_code(name, code_cells(name, data))


def from_code(name: str, sources: list[str]) -> dict[str, str]:
    """``exercise_files`` of the notebook whose code cells are ``sources``."""
    kept = [pair for source in sources for pair in _kept(name, source)]
    defined = {node.name for node, _ in kept if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    body = "\n\n".join(text for _, text in kept)
    # the notebook's name goes in as ascii() in a comment: a name is never code
    return {exercise.filename: f"# {exercise.module_name}: the imports and definitions of {ascii(name)}\n"
                               f"from __future__ import annotations\n\n{body}\n"
            for exercise in EXERCISES if all(function in defined for _, function in exercise.functions)}


def code_cells(name: str, data: bytes, max_code: int = MAX_CODE) -> list[str]:
    """The source of each code cell, in order; NotebookError past ``max_code`` characters in all."""
    if data.count(b"{") + data.count(b"[") > MAX_CONTAINERS:  # counted before JSON takes ~25 times the bytes
        raise NotebookError(f"{name}: not read, it opens more than {MAX_CONTAINERS:,} JSON objects and arrays "
                            "(a notebook's cells and outputs need far fewer)")
    try:
        notebook = json.loads(data)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise NotebookError(f"{name} is not a notebook: not valid JSON ({error})") from None
    except RecursionError:
        raise NotebookError(f"{name} is not a notebook: its JSON is nested too deeply to read") from None
    if not isinstance(notebook, dict) or notebook.get("nbformat") != 4 or not isinstance(notebook.get("cells"), list):
        raise NotebookError(f"{name} is not an nbformat 4 notebook (no 'nbformat': 4 with a list of cells)")
    sources = []
    for number, cell in enumerate(notebook["cells"], 1):
        if not isinstance(cell, dict):
            raise NotebookError(f"{name}: cell {number} is not a cell (a JSON object), it is a {type(cell).__name__}")
        if cell.get("cell_type") == "code":
            sources.append(_text(name, number, cell.get("source", "")))
    if sum(map(len, sources)) > max_code:
        raise NotebookError(f"{name}: not read, an upload's notebooks may hold {MAX_CODE // 1024} KB of code in "
                            "all, the most the grader parses (put data in files, not in cells)")
    return sources


def _text(name: str, number: int, source) -> str:
    """A cell's source: a string, or a list of strings (its lines) as nbformat writes it."""
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(line, str) for line in source):
        return "".join(source)
    raise NotebookError(f"{name}: code cell {number}'s source is not text (a string or a list of strings)")


def _kept(name: str, source: str) -> list[tuple[ast.stmt, str]]:
    """The top-level imports, definitions and constant assignments of one code cell, each with
    its source text."""
    if source.lstrip().startswith("%%"):
        return []  # a cell magic (%%timeit, %%bash, ...): its body is not Python
    python, tree = _parse(name, source)
    lines = LINE.findall(python)  # once a cell: ast.get_source_segment splits them at every call
    return [(node, _segment(lines, node)) for node in tree.body if _is_definition(node)]


def _parse(name: str, source: str) -> tuple[str, ast.Module]:
    try:
        return source, _ast(name, source)  # a cell that parses is kept byte for byte, strings included
    except SyntaxError:
        pass
    python = "\n".join(_without_magic(line) for line in source.splitlines())
    try:
        return python, _ast(name, python)
    except SyntaxError as error:
        first = source.strip().splitlines()[0] if source.strip() else ""
        raise NotebookError(f"{name}: the code cell starting {first[:60]!r} is not Python: "
                            f"{error.msg} on its line {error.lineno}") from None


def _ast(name: str, source: str) -> ast.Module:
    """``ast.parse``, with the parser's own limits (null bytes, nesting) as NotebookError."""
    try:
        return ast.parse(source)
    except (ValueError, RecursionError, MemoryError) as error:
        raise NotebookError(f"{name}: a code cell cannot be parsed ({type(error).__name__})") from None


def _without_magic(line: str) -> str:
    """``pass`` at the same indent in place of an IPython line, so that the blocks around it stay valid."""
    if not MAGIC.match(line):
        return line
    return line[:len(line) - len(line.lstrip())] + "pass"


def _is_definition(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.module != "__future__"  # the written file starts with its own
    if isinstance(node, (ast.Import, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return (all(isinstance(t, ast.Name) for t in targets)
                and all(isinstance(n, CONSTANT_NODES) for n in ast.walk(node.value)))
    return False


def _segment(lines: list[str], node: ast.stmt) -> str:
    """The node's source text, its decorators included (``ast.get_source_segment`` on the cell's
    ``lines``; the parser's columns count UTF-8 bytes)."""
    decorators = getattr(node, "decorator_list", None)
    first, col = (decorators[0], 0) if decorators else (node, node.col_offset)  # from the '@' on
    chunk = [line.encode() for line in lines[first.lineno - 1:node.end_lineno]]
    chunk[-1] = chunk[-1][:node.end_col_offset]
    chunk[0] = chunk[0][col:]
    return b"".join(chunk).decode()
