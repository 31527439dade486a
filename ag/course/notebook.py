"""nbgrader's source notebooks, built with jupytext from the marked source and the graded tests,
and the two helpers their cells call in the kernel.

One notebook per exercise, ``nbgrader/source/exN_name/exN_name.ipynb`` (nbgrader's course layout):
the statement; the exercise's imports; one solution cell per function that holds a marked region
(``### BEGIN SOLUTION`` / ``### END SOLUTION`` are nbgrader's own markers, so the cell is the
function as ag has it); the self-check; the graded tests' probes and helpers; and one locked,
graded cell per graded test (per parametrization), the hidden ones inside ``### BEGIN HIDDEN
TESTS`` / ``### END HIDDEN TESTS``. nbgrader makes the students' version itself
(``nbgrader generate_assignment``), so only the source is written.

In the kernel there is no judge: a test cell runs its check where the probes run, on the
notebook's own functions (``worker``). The probes' arguments and results still pass through the
judge's channel encoding, so a check sees the plain data it would see under ``ag grade``.
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import site
import sys
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from . import channel
from .escape import plain_text
from .exercises import EXERCISES, PACKAGE, REPO, Exercise, exercise_of
from .install import install as install_module
from .regions import BEGIN, function_source

NOTEBOOKS = Path("nbgrader") / "source"  # under the repository: nbgrader's course directory
GRADING = REPO / "tests" / "grading"
REFERENCES = {"references": Path("references") / "__init__.py",  # public (under GRADING)
              "zero_pages": Path("zero_pages.py"),  # public ops the memory probes build chains of
              "judge_references": Path("hidden") / "judge_references.py"}  # the hidden tests' only
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
FIXTURES = ("worker",)  # the only fixture the graded tests may ask for: the notebook provides it
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def install(namespace: dict, exercise: str) -> types.ModuleType:
    """Put the notebook's functions for ``exercise`` ("ex3_online_softmax") into ag, as
    ``course.install`` does for an exercise file; return them as that exercise's module."""
    found = next((e for e in EXERCISES if e.module_name == exercise), None)
    if found is None:
        raise LookupError(f"notebook.install: no exercise {exercise!r}; the exercises are "
                          f"{', '.join(e.module_name for e in EXERCISES)}")
    missing = [name for _, name in found.functions if not callable(namespace.get(name))]
    if missing:
        raise NameError(f"notebook.install: this notebook defines no {', '.join(missing)} yet: run the cells "
                        "above this one first")
    module = types.ModuleType(found.module_name)  # named for the exercise, so course.install knows it
    vars(module).update((k, v) for k, v in namespace.items() if not k.startswith("__"))
    install_module(module)
    return module


def worker(namespace: dict, exercise: str) -> Callable:
    """The graded tests' ``worker`` fixture in a notebook: ``worker(probe, *args)`` runs the probe
    on the notebook's functions (installed into ag first) with the data round-tripped through the
    judge's channel, so arguments are copies and results plain data, as under ``ag grade``.
    ``worker.once`` runs the probe again each time: a kernel keeps no probe's data between tests."""
    module = install(namespace, exercise)

    def run(probe, *args, **kwargs):
        args, kwargs = channel.decode(channel.encode([list(args), kwargs]))
        return channel.decode(channel.encode(probe(module, *args, **kwargs)))
    run.once = run
    return run


def failure(test: Callable, *args) -> str | None:
    """Run a graded test's check in the kernel: None if it passes, else what failed, as plain text.

    The test cell asserts on the result itself (``assert failure is None, failure``), so nbgrader's
    feedback shows the check's message under the cell's own lines: no traceback through ag's files
    (the instructor's paths), no Markdown (a notebook's error output is not rendered)."""
    try:
        test(*args)
    except AssertionError as error:
        return plain_text(str(error) or "the check failed")
    except Exception as error:  # noqa: BLE001 -- the student's code failed: say how, and where in it
        return f"Your code raised {type(error).__name__}: {error}{_where(error)}"
    return None


def _where(error: BaseException) -> str:
    """Where in the notebook's own code ``error`` arose: the innermost frame outside Python and ag."""
    outside = [Path(p).resolve() for p in (PACKAGE, sys.prefix, sys.base_prefix, *site.getsitepackages())]
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = Path(frame.filename).resolve()
        if not any(path.is_relative_to(o) for o in outside):
            return f" (in {frame.name}, line {frame.lineno} of its cell)"
    return ""


class Cell(NamedTuple):
    kind: str  # "markdown" or "code"
    name: str  # grade_id, and the cell's id
    source: str
    role: str  # "solution", "test" (graded) or "locked"
    points: float = 0


class GradedTest(NamedTuple):
    grade_id: str
    points: float
    hidden: bool
    source: str  # the test's definition (dropped for a later parametrization) and its call


def notebook_files(root: Path) -> dict[Path, str]:
    """Each exercise's source notebook under ``root``, as the text to write."""
    return {root / NOTEBOOKS / e.module_name / f"{e.module_name}.ipynb": render_notebook(e) for e in EXERCISES}


def render_notebook(exercise: Exercise) -> str:
    """The source notebook of one exercise: JSON as nbformat writes it, no outputs, fixed cell ids."""
    try:
        import jupytext
        import nbformat
    except ImportError as error:
        raise ImportError(f"the nbgrader notebooks need jupytext ({error}): pip install -e '.[course]'") from None
    cells = _cells(exercise)
    notebook = jupytext.reads(percent_script(cells), fmt="py:percent")
    if [(c.cell_type, c.source) for c in notebook.cells] != [(c.kind, c.source) for c in cells]:
        raise ValueError(f"{exercise.module_name}: jupytext read back cells that differ from those written")
    for cell, ours in zip(notebook.cells, cells):
        cell.id, cell.metadata = _cell_id(ours.name), {"nbgrader": _metadata(ours)}  # jupytext's own keys go
    notebook.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    notebook.nbformat, notebook.nbformat_minor = 4, 5
    nbformat.validate(notebook)
    return nbformat.writes(notebook) + "\n"


def percent_script(cells: list[Cell]) -> str:
    """The notebook as a jupytext percent script, each cell's nbgrader metadata on its marker line."""
    parts = []
    for cell in cells:
        marker, body = "# %%", cell.source
        if cell.kind == "markdown":
            marker, body = "# %% [markdown]", "\n".join(f"# {line}".rstrip() for line in body.split("\n"))
        parts.append(f"{marker} nbgrader={json.dumps(_metadata(cell), sort_keys=True)}\n{body}\n")
    return "\n".join(parts)


def _metadata(cell: Cell) -> dict:
    """nbgrader's cell metadata (schema 3): a solution cell, a graded test cell, or a read-only cell."""
    meta = {"grade": cell.role == "test", "grade_id": cell.name, "locked": cell.role != "solution",
            "schema_version": 3, "solution": cell.role == "solution"}
    if cell.role == "test":
        meta["points"] = cell.points
    return meta


def _cell_id(name: str) -> str:
    """A valid nbformat cell id (at most 64 of [A-Za-z0-9_-]) that is the same on every run."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "-", name)
    return clean if len(clean) <= 64 else f"{clean[:55]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def _cells(exercise: Exercise) -> list[Cell]:
    setup, tests = graded_tests(exercise)
    shadowed = _defined(setup) & {f for _, f in exercise.functions}
    if shadowed:
        raise ValueError(f"{exercise.module_name}: the graded tests define {sorted(shadowed)}, which would replace "
                         "the student's functions in the notebook; rename them in tests/grading/")
    cells = [Cell("markdown", "statement", _statement(exercise, tests), "locked"),
             Cell("code", "imports", f"from __future__ import annotations\n\n{exercise.imports}", "locked")]
    for module, function in exercise.functions:
        source = function_source(module, function).rstrip("\n")
        cells.append(Cell("code", function, source, "solution" if BEGIN in source else "locked"))
    cells += [Cell("markdown", "check-heading", "## Check yourself", "locked"),
              Cell("code", "check", _self_check(exercise), "locked"),
              Cell("markdown", "tests-heading", "## Graded tests\n\nEach cell below is one graded test; it "
                   "passes when it runs without an error. The probes (`@probe`), which `ag grade` runs in a "
                   "sandboxed worker, run here in this kernel, on your functions.", "locked"),
              Cell("code", "tests-setup", setup, "locked")]
    cells += [Cell("code", t.grade_id, t.source, "test", t.points) for t in tests]
    return cells


def _defined(code: str) -> set[str]:
    """The names a cell's top-level statements bind."""
    names = set()
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names


def _statement(exercise: Exercise, tests: list[GradedTest]) -> str:
    total, hidden = sum(t.points for t in tests), [t for t in tests if t.hidden]
    points = f"**{total:g} points** in {len(tests)} graded tests"
    if hidden:
        points += (f", {len(hidden)} of them ({sum(t.points for t in hidden):g} points) hidden until grades "
                   "are published")
    functions = ", ".join(f"`{f}`" for _, f in exercise.functions)
    origin = ", ".join(sorted({f"`ag/{m.replace('.', '/')}.py`" for m, _ in exercise.functions}))
    expected = "\n".join(f"    {line}" for line in exercise.expected.split("\n"))
    needs = ""
    if exercise.needs:
        numbers = " and ".join(str(n) for n in exercise.needs)
        needs = (f"\n\nIt runs on exercise{'s' * (len(exercise.needs) > 1)} {numbers} too; the graded tests use "
                 "ag's own solution there, so only this exercise counts here.")
    return (f"# Exercise {exercise.number}: {exercise.title}\n\n{points}.\n\n{exercise.statement}{needs}\n\n"
            f"Fill in every `# YOUR CODE HERE` in {functions} (cut from {origin}). "
            f"The cell under *Check yourself* should print\n\n{expected}\n\n"
            "Generated by `ag assign --format notebook`; the graded tests come from `tests/grading/`.")


def _self_check(exercise: Exercise) -> str:
    """The exercise's check, with ``course.install(__name__)`` done the notebook's way."""
    lines, out, installed = exercise.checks.split("\n"), [], 0
    for line in lines:
        if line == "from ag import course":
            out.append("from ag.course import notebook")
        elif line.startswith("from ag import course, "):
            out += ["from ag import " + line.removeprefix("from ag import course, "), "from ag.course import notebook"]
        elif line == "course.install(__name__)":
            out.append(f'notebook.install(globals(), "{exercise.module_name}")')
            installed += 1
        else:
            out.append(line)
    if installed != 1 or "course." in "\n".join(out).replace("ag.course", ""):
        raise ValueError(f"{exercise.module_name}: its check must call course.install(__name__) once, after "
                         "`from ag import course`, for the notebook to install its functions instead")
    return "\n".join(out)


class _Module(NamedTuple):
    imports: list[str]
    references: dict[str, list[str]]  # names it imports from each of REFERENCES
    definitions: list[str]  # everything else but the tests: probes, helpers, constants
    tests: list[ast.FunctionDef]
    lines: list[str]


def graded_tests(exercise: Exercise, grading: Path = GRADING) -> tuple[str, list[GradedTest]]:
    """The tests' setup cell (imports, references, probes, helpers, the ``worker``) and one graded
    test per test and parametrization: the public file's in order, then the hidden files'."""
    public = sorted(grading.glob(f"test_ex{exercise.number}_*.py"))
    if len(public) != 1:
        raise FileNotFoundError(f"{exercise.module_name}: expected one {grading}/test_ex{exercise.number}_*.py, "
                                f"found {len(public)}")
    hidden = [p for p in sorted((grading / "hidden").glob("test_*.py")) if exercise_of(p) is exercise]
    module = _read(public[0], public[0].stem)
    references = _all_references(grading, module.references)
    setup = "\n".join(_unique(module.imports + references.imports + ["from ag.course import notebook"])) + "\n\n\n"
    setup += "\n\n\n".join(references.definitions + module.definitions)
    setup += f'\n\n\nworker = notebook.worker(globals(), "{exercise.module_name}")'
    tests = _tests(module, public[0], hidden=False)
    for path in hidden:
        extra = _read(path, public[0].stem)
        found = _all_references(grading, {m: [r for r in names if r not in module.references.get(m, [])]
                                          for m, names in extra.references.items()})
        preamble = "\n".join(_unique([i for i in extra.imports + found.imports if i not in module.imports]))
        preamble = "\n\n\n".join(filter(None, [preamble] + found.definitions + extra.definitions))
        tests += _tests(extra, path, hidden=True, preamble=preamble)
    return setup, tests


def _read(path: Path, public: str) -> _Module:
    """A graded test file split up; ``from references import`` and imports from the public file
    (``public``, which the notebook has run already) are left out of its imports."""
    text = path.read_text()
    tree, lines = ast.parse(text), text.split("\n")
    module = _Module([], {}, [], [], lines)
    for node in tree.body:
        segment = "\n".join(lines[node.lineno - 1:node.end_lineno])
        if isinstance(node, ast.ImportFrom) and node.module in REFERENCES:
            module.references.setdefault(node.module, []).extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == public:
            continue
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module.imports.append(segment)
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            module.tests.append(node)
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):  # not the docstring
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            module.definitions.append("\n".join(lines[first - 1:node.end_lineno]))
    if not _uses_pytest(tree):
        module.imports[:] = [i for i in module.imports if i != "import pytest"]  # only the markers used it
    return module


def _uses_pytest(tree: ast.Module) -> bool:
    """Whether anything but a decorator (the markers, which the notebook drops) names pytest."""
    decorators = {id(d) for n in ast.walk(tree) for d in getattr(n, "decorator_list", [])}
    skipped = {id(n) for d in ast.walk(tree) if id(d) in decorators for n in ast.walk(d)}
    return any(isinstance(n, ast.Name) and n.id == "pytest" and id(n) not in skipped for n in ast.walk(tree))


class _References(NamedTuple):
    imports: list[str]
    definitions: list[str]


def _all_references(grading: Path, names: dict[str, list[str]]) -> _References:
    """The functions each of REFERENCES gives for ``names`` ({module: names}), with their imports."""
    found = [_references(grading / REFERENCES[module], wanted) for module, wanted in names.items()]
    return _References([i for f in found for i in f.imports], [d for f in found for d in f.definitions])


def _references(path: Path, names: list[str]) -> _References:
    """The functions ``names`` of a references file and those they call, in the file's order, with its imports."""
    if not names:
        return _References([], [])
    text = path.read_text()
    tree, lines = ast.parse(text), text.split("\n")
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    wanted, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        if name not in functions:
            raise LookupError(f"{path.name} has no function {name!r}")
        wanted.add(name)
        todo += [n.id for n in ast.walk(functions[name]) if isinstance(n, ast.Name) and n.id in functions]
    imports = ["\n".join(lines[n.lineno - 1:n.end_lineno]) for n in tree.body
               if isinstance(n, (ast.Import, ast.ImportFrom))]
    return _References(imports, ["\n".join(lines[f.lineno - 1:f.end_lineno])
                                 for f in functions.values() if f.name in wanted])


def _tests(module: _Module, path: Path, *, hidden: bool, preamble: str = "") -> list[GradedTest]:
    """One GradedTest per test function and parametrization; hidden ones wrapped in nbgrader's markers."""
    tests = []
    for node in module.tests:
        points, marked_hidden, parameters = _markers(node, path)
        if marked_hidden != hidden:
            where = "outside tests/grading/hidden/" if marked_hidden else "in tests/grading/hidden/"
            raise ValueError(f"{path.name}: {node.name} is {'' if marked_hidden else 'not '}marked hidden but "
                             f"sits {where}")
        definition = "\n".join(module.lines[node.lineno - 1:node.end_lineno])
        names = [a.arg for a in node.args.args]
        fixtures = [n for n in names if n not in (parameters[0] if parameters else ())]
        if any(f not in FIXTURES for f in fixtures):
            raise ValueError(f"{path.name}: {node.name} asks for the fixtures {fixtures}; a notebook provides "
                             f"only {', '.join(FIXTURES)}")
        for index, values in enumerate(parameters[1] if parameters else [()]):
            given = dict(zip(parameters[0], values)) if parameters else {}
            arguments = "".join(f", {n if n in FIXTURES else repr(given[n])}" for n in names)
            call = f"failure = notebook.failure({node.name}{arguments})\nassert failure is None, failure"
            body = f"{definition}\n\n\n{call}" if index == 0 else call
            suffix = "-".join(re.sub(r"[^A-Za-z0-9_]", "_", str(v)) for v in values)
            grade_id = f"{node.name}-{suffix}" if suffix else node.name
            if hidden:
                head = "\n\n\n".join(filter(None, [preamble if not tests else "", body]))
                body = (f"# A hidden test, worth {points:g} points: its code is shown after grades are "
                        f"published.\n{HIDDEN_BEGIN}\n{head}\n{HIDDEN_END}")
            tests.append(GradedTest(grade_id, points, hidden, body))
    return tests


def _markers(node: ast.FunctionDef, path: Path) -> tuple[float, bool, tuple[list[str], list[tuple]] | None]:
    """A test's ``points(n)``, whether it is ``hidden``, and its ``parametrize`` (names, value tuples)."""
    points, hidden, parameters = None, False, None
    for decorator in node.decorator_list:
        call = decorator if isinstance(decorator, ast.Call) else None
        mark = ast.unparse(call.func if call else decorator)
        if mark == "pytest.mark.points" and call and len(call.args) == 1:
            points = ast.literal_eval(call.args[0])
        elif mark == "pytest.mark.hidden":
            hidden = True
        elif mark == "pytest.mark.parametrize" and call and len(call.args) == 2 and parameters is None:
            names, values = ast.literal_eval(call.args[0]), ast.literal_eval(call.args[1])
            names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
            values = [tuple(v) if len(names) > 1 else (v,) for v in values]
            parameters = (names, values)
        else:
            raise ValueError(f"{path.name}: {node.name} has the decorator @{ast.unparse(decorator)}, which a "
                             "notebook cannot express (points, hidden and one parametrize only)")
    if points is None:
        raise ValueError(f"{path.name}: {node.name} has no @pytest.mark.points(n)")
    return points, hidden, parameters


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
