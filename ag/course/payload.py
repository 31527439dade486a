"""What a worker gets, decided on the judge's side: its files, and what on the machine it must not see.

The sandbox only isolates: it writes the files it is handed under the worker's root and covers
the paths it is told to. The choice is made here, for one exercise of one submission:

- ``lib/ag/``: ag's package with that exercise stubbed (``assign.package_files({N})``), so the
  exercise runs the student's code and every other exercise the library's solution, each module
  with its bytecode (``with_bytecode``): a folder written here once per exercise and bound
  read-only into each worker (``worker_trees``), so no worker compiles ag or is sent it;
- ``lib/test_exN_*.py``: the exercise's public test files without their checks (``probe_source``);
- ``lib/<helper>.py``: the other public ``.py`` files of the tests folder that the probes import
  (not ``test_*``, not ``conftest*``; nothing of ``hidden/``);
- ``submission/exK_*.py``: the student's exercise files (regular files, 2 MiB at most each).
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import marshal
import tempfile
from pathlib import Path

from .assign import package_files
from .exercises import PACKAGE, REPO, Exercise

MAX_SUBMITTED_FILE = 2 * 2**20
INSTRUCTOR_MARKS = ("ag", "ag-src", "pyproject.toml", "solutions")  # a folder holding one is the instructor's


def worker_files(exercise: Exercise, submission: Path, tests: Path) -> dict[str, bytes]:
    """The files of the worker for ``exercise``, keyed by their path under the sandbox's root
    (ag itself comes as a folder: ``worker_trees``)."""
    files = {}
    for test_file in sorted(tests.glob(f"test_ex{exercise.number}_*.py")):
        files[f"lib/{test_file.name}"] = probe_source(test_file).encode()
    for helper in sorted(tests.glob("*.py")):  # public helpers the probes import (zero_pages.py); not references/, a folder
        if not helper.name.startswith(("test_", "conftest")):
            files[f"lib/{helper.name}"] = helper.read_bytes()
    for mine in sorted(submission.glob("ex*.py")):
        if mine.is_file() and mine.stat().st_size <= MAX_SUBMITTED_FILE:
            files[f"submission/{mine.name}"] = mine.read_bytes()
    return files


def worker_trees(exercise: Exercise) -> dict[str, str]:
    """The folders the worker for ``exercise`` gets read-only, keyed by their path under the
    sandbox's root: ``lib/ag``, ag with that exercise stubbed (the same for every student)."""
    return {f"lib/{PACKAGE.name}": str(_package_folder(exercise.number) / PACKAGE.name)}


@functools.lru_cache(maxsize=None)
def _package_folder(number: int) -> Path:
    """ag with exercise ``number`` stubbed, with its bytecode, written once in this process's
    folder (``_packages``): files 0644 and folders 0755, so the worker's user reads them."""
    folder = Path(_packages().name) / f"ex{number}"
    for path, data in with_bytecode(package_files({number})).items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
        (folder / path).chmod(0o644)
    for inner in [folder, *folder.rglob("*")]:
        if inner.is_dir():
            inner.chmod(0o755)  # whatever the umask
    return folder


@functools.lru_cache(maxsize=1)
def _packages() -> tempfile.TemporaryDirectory:
    """The folder of this process's stubbed packages, removed when it exits (or ``remove_packages``)."""
    return tempfile.TemporaryDirectory(prefix="ag-packages-")


def remove_packages() -> None:
    """Remove the stubbed packages now (a judge stopped by a signal exits without its finalizers)."""
    if _packages.cache_info().currsize:
        _packages().cleanup()
    _packages.cache_clear()
    _package_folder.cache_clear()


def with_bytecode(files: dict[str, bytes]) -> dict[str, bytes]:
    """``files`` and, beside each module, its bytecode where Python looks for it (``__pycache__``),
    checked against the source's hash (PEP 552), not its time: valid wherever the files are written,
    and ignored if the source differs. The worker's Python is this one, so it reads them as they are."""
    compiled = {importlib.util.cache_from_source(path, optimization=""): bytecode(path, source)
                for path, source in files.items() if path.endswith(".py")}
    return {**files, **compiled}


@functools.lru_cache(maxsize=None)
def bytecode(path: str, source: bytes) -> bytes:
    """A checked hash-based .pyc of ``source`` (most of ag is the same for every exercise: compiled once)."""
    code = compile(source, path, "exec", dont_inherit=True)
    header = importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little") + importlib.util.source_hash(source)
    return header + marshal.dumps(code)


def secrets(tests: Path, submission: Path, extra=()) -> list[Path]:
    """What the worker must not see: ag's source, the repository, the graded tests and the
    instructor's folder around them, the other submissions beside this one, and ``extra``."""
    tests, submission = tests.resolve(), submission.resolve()
    found = [PACKAGE, tests, submission.parent, Path(tempfile.gettempdir()), *map(Path, extra)]
    if (REPO / "pyproject.toml").exists():
        found.append(REPO)
    for folder in (tests.parent, tests.parent.parent):
        if any((folder / name).exists() for name in INSTRUCTOR_MARKS):
            found.append(folder)
    return [Path(p).resolve() for p in found]


def probe_source(test_file: Path) -> str:
    """A public graded test file without its checks: the ``test_*`` functions are cut out, so the
    worker gets the probes and their helpers and never sees an assertion or an expected value;
    the imports only the checks used go too (pytest's import alone would cost each worker 0.15 s)."""
    return _without_checks(test_file.read_text())


@functools.lru_cache(maxsize=64)
def _without_checks(text: str) -> str:
    """``probe_source`` of a test file's text (the same for every student: cut once)."""
    lines = text.splitlines(keepends=True)
    checks = [n for n in ast.parse("".join(lines)).body
              if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name.lower().startswith("test")]
    _delete(lines, checks)
    tree = ast.parse("".join(lines))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    unused = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
              and not any((a.asname or a.name).split(".")[0] in used for a in n.names)]
    _delete(lines, unused)
    return "".join(lines)


def _delete(lines: list[str], nodes) -> None:
    """Remove the nodes' lines (decorators included), last first so the line numbers hold."""
    for node in sorted(nodes, key=lambda n: n.lineno, reverse=True):
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        del lines[start:node.end_lineno]
