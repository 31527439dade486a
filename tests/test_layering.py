"""The code as a lecture: imports point down, no module uses another module's private names, and
no module shadows a built-in. Each rule reads the source of every module under ag/ with ``ast``."""
from __future__ import annotations

import ast
import builtins
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ag"
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)

UPPER_MODULES = ("ag.demo", "ag.cli")  # the top of the house: only the command line reaches them
MAY_IMPORT_UPPER = ("ag/cli.py", "ag/__main__.py")
MAY_SHADOW_BUILTINS = ("ag/ops/elementwise.py", "ag/ops/reductions.py",  # they define ag.pow, ag.sum, ag.max
                       "ag/ops/__init__.py", "ag/__init__.py")  # these re-export them
BUILTIN_NAMES = frozenset(name for name in dir(builtins) if not name.startswith("__"))


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def _modules_under(package: Path) -> frozenset[str]:
    """The dotted names of ag's modules and packages: ``ag``, ``ag.remat``, ``ag.remat.dtr``..."""
    names = set()
    for path in package.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(package.parent).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return frozenset(names)


MODULES = _modules_under(PACKAGE)


def _module_of(path: str) -> str:
    """``ag/remat/dtr.py`` is ``ag.remat.dtr``; ``ag/remat/__init__.py`` is ``ag.remat``."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: str) -> str:
    """The package that relative imports in ``path`` start from."""
    return _module_of(path) if path.endswith("__init__.py") else _module_of(path).rpartition(".")[0]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_ag(module: str) -> bool:
    return module == "ag" or module.startswith("ag.")


def _imported_from(path: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from X import ...`` reads from."""
    if not node.level:
        return node.module or ""
    base = _package_of(path).split(".")
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private_module_outside(importer: str, module: str) -> bool:
    """Whether ``module`` has a private part (``ag.course._stubbed``) that ``importer`` lives outside
    of: a private module belongs to its package, and only that package's modules may use it."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        owner = ".".join(parts[:i])
        if _is_private(part) and importer != owner and not importer.startswith(owner + "."):
            return True
    return False


# ---- rule a: imports point down ----

def upper_imports(path: str, source: str) -> list[str]:
    """``file:line`` of every import of ag.demo or ag.cli, relative or absolute, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = _imported_from(path, node)
            targets = [origin] + [f"{origin}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            hit = next((m for m in UPPER_MODULES if target == m or target.startswith(m + ".")), None)
            if hit:
                found.append(f"{path}:{node.lineno}: imports {hit}")
                break
    return found


# ---- rule b: no module uses another module's private names ----

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_SCOPES = _FUNCTIONS + (ast.ClassDef,)


def _runs_outside(node: ast.AST) -> list[ast.AST]:
    """The parts of a def, class or lambda that run in the enclosing scope: decorators, defaults, bases."""
    parts = list(getattr(node, "decorator_list", ()))
    if isinstance(node, ast.ClassDef):
        return parts + node.bases + [keyword.value for keyword in node.keywords]
    return parts + [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]


def _own_nodes(scope: ast.AST):
    """The nodes of one scope, not descending into the bodies of the functions and classes it defines."""
    stack = [scope.body] if isinstance(scope, ast.Lambda) else list(scope.body)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(_runs_outside(node) if isinstance(node, _SCOPES) else ast.iter_child_nodes(node))


class _Scope:
    """The names one scope binds: to an ag module by an import, or to anything else."""

    def __init__(self, node: ast.AST, path: str, modules: frozenset[str]) -> None:
        self.node, self.modules, self.others = node, {}, set()
        if isinstance(node, _FUNCTIONS):
            args = node.args
            self.others |= {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg,
                                            args.kwarg) if a is not None}
        for child in _own_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.asname:
                        self._bind(alias.asname, alias.name if alias.name in modules else None)
                    else:
                        top = alias.name.partition(".")[0]
                        self._bind(top, top if top in modules else None)
            elif isinstance(child, ast.ImportFrom):
                origin = _imported_from(path, child)
                for alias in child.names:
                    target = f"{origin}.{alias.name}"
                    self._bind(alias.asname or alias.name, target if target in modules else None)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, (ast.Store, ast.Del)):
                self.others.add(child.id)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.others.add(child.name)
            elif isinstance(child, ast.ExceptHandler) and child.name:
                self.others.add(child.name)

    def _bind(self, name: str, module: str | None) -> None:
        if name == "*":
            return
        if module is None:
            self.others.add(name)
        else:
            self.modules[name] = module


def _module_named(name: str, scopes: list[_Scope]) -> str | None:
    """The ag module ``name`` stands for in the innermost scope of ``scopes`` (None: not a module).
    A class body's names are not seen from the functions inside it."""
    for depth, scope in enumerate(reversed(scopes)):
        if depth and isinstance(scope.node, ast.ClassDef):
            continue
        if name in scope.others:
            return None
        if name in scope.modules:
            return scope.modules[name]
    return None


def _module_of_expression(node: ast.AST, scopes: list[_Scope], modules: frozenset[str]) -> str | None:
    """``trace`` or ``plot.labels``, when each name is an ag module bound by an import."""
    if isinstance(node, ast.Name):
        return _module_named(node.id, scopes)
    if isinstance(node, ast.Attribute):
        outer = _module_of_expression(node.value, scopes, modules)
        if outer and f"{outer}.{node.attr}" in modules:
            return f"{outer}.{node.attr}"
    return None


def private_uses(path: str, source: str, modules: frozenset[str] = MODULES) -> list[str]:
    """``file:line`` of every private name (``_x``, not ``__x__``) this module takes from another ag
    module: ``from .x import _name``, ``from . import _x`` (unless ``_x`` is a module of this
    module's own package) and ``module._name`` where ``module`` was bound by importing an ag module.
    Attributes of objects (``tensor._needed_by``) are not module names and pass."""
    here = _module_of(path)
    found = []

    def other_module_private(module: str, name: str) -> bool:
        target = f"{module}.{name}"
        if target in modules:  # a submodule: private only if it lies in a package we are outside of
            return _private_module_outside(here, target)
        return _is_private(name) and module != here

    def visit(scope_node: ast.AST, scopes: list[_Scope]) -> None:
        scopes = scopes + [_Scope(scope_node, path, modules)]
        for node in _own_nodes(scope_node):
            if isinstance(node, ast.ImportFrom):
                origin = _imported_from(path, node)
                if not _is_ag(origin):
                    continue
                if _private_module_outside(here, origin):
                    found.append(f"{path}:{node.lineno}: imports the private module {origin}")
                for alias in node.names:
                    if other_module_private(origin, alias.name):
                        found.append(f"{path}:{node.lineno}: imports {alias.name} from {origin}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_ag(alias.name) and _private_module_outside(here, alias.name):
                        found.append(f"{path}:{node.lineno}: imports the private module {alias.name}")
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                module = _module_of_expression(node.value, scopes, modules)
                if module and other_module_private(module, node.attr):
                    found.append(f"{path}:{node.lineno}: uses {module}.{node.attr}")
            if isinstance(node, _SCOPES):
                visit(node, scopes)

    visit(ast.parse(source), [])
    return sorted(set(found), key=lambda line: (int(line.split(":")[1]), line))


# ---- rule c: no built-in shadowed ----

def _bound_names(node: ast.AST) -> list[str]:
    """The names a module-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [alias.asname or alias.name.partition(".")[0] for alias in node.names if alias.name != "*"]
    targets = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
    elif isinstance(node, ast.NamedExpr):
        targets = [node.target]
    elif isinstance(node, ast.ExceptHandler) and node.name:
        return [node.name]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def shadowed_builtins(path: str, source: str) -> list[str]:
    """``file:line`` of every module-level binding (def, class, assignment, import) of a built-in's name."""
    found = []
    for node in _own_nodes(ast.parse(source)):
        for name in _bound_names(node):
            if name in BUILTIN_NAMES:
                found.append(f"{path}:{node.lineno}: binds the built-in {name}")
    return sorted(found, key=lambda line: int(line.split(":")[1]))


# ---- rule d: ops never needs builtins ----

def builtins_uses(path: str, source: str) -> list[str]:
    """``file:line`` of every import of ``builtins`` and every ``builtins.x`` it reads."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name == "builtins" for a in node.names):
            found.append(f"{path}:{node.lineno}: imports builtins")
        elif isinstance(node, ast.ImportFrom) and node.module == "builtins" and not node.level:
            found.append(f"{path}:{node.lineno}: imports from builtins")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "builtins":
            found.append(f"{path}:{node.lineno}: uses builtins.{node.attr}")
    return found


# ---- rule e: nothing walks stack frames (observation is events) ----

FRAME_ATTRIBUTES = frozenset({"_getframe", "currentframe", "getouterframes", "getinnerframes", "stack", "trace",
                              "walk_stack", "extract_stack", "f_back", "f_locals", "f_globals", "f_code", "tb_frame"})


def frame_walks(path: str, source: str) -> list[str]:
    """``file:line`` of every read of a frame or of a call stack (``sys._getframe``, ``inspect.stack``,
    ``frame.f_back`` ...), and every import of such a function."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in ("sys", "inspect", "traceback"):
            found += [f"{path}:{node.lineno}: imports {a.name} from {node.module}" for a in node.names
                      if a.name in FRAME_ATTRIBUTES]
        elif isinstance(node, ast.Attribute) and node.attr in FRAME_ATTRIBUTES:
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if node.attr.startswith(("f_", "tb_", "_get", "current", "get", "walk", "extract")) \
                    or owner in ("inspect", "sys", "traceback"):
                found.append(f"{path}:{node.lineno}: reads {owner or '...'}.{node.attr}")
    return sorted(found, key=lambda line: int(line.split(":")[1]))


def _offenders(check, paths=None, **kwargs) -> list[str]:
    found = []
    for source in SOURCES:
        path = _relative(source)
        if paths is None or path in paths:
            found += check(path, source.read_text(), **kwargs)
    return found


def _message(rule: str, offenders: list[str]) -> str:
    return f"{rule}; {len(offenders)} offender(s):\n  " + "\n  ".join(offenders)


def test_no_module_below_the_command_line_imports_demo_or_cli():
    offenders = [line for line in _offenders(upper_imports) if line.split(":")[0] not in MAY_IMPORT_UPPER]
    assert not offenders, _message("only ag/cli.py and ag/__main__.py may import ag.demo or ag.cli", offenders)


def test_no_module_uses_another_modules_private_names():
    offenders = _offenders(private_uses)
    assert not offenders, _message("a name another module uses is public: drop its leading underscore",
                                   offenders)


def test_no_module_but_ops_shadows_a_builtin_at_module_level():
    offenders = [line for line in _offenders(shadowed_builtins) if line.split(":")[0] not in MAY_SHADOW_BUILTINS]
    assert not offenders, _message("only ag/ops/ and ag/__init__.py may bind a built-in's name", offenders)


def test_ops_never_needs_the_builtins_module():
    ops = {_relative(p) for p in SOURCES if _relative(p).startswith("ag/ops/")}
    assert {"ag/ops/__init__.py", "ag/ops/elementwise.py", "ag/ops/reductions.py"} <= ops
    offenders = _offenders(builtins_uses, paths=ops)
    assert not offenders, _message("ag/ops/ reaches past its own sum/max/... to builtins", offenders)


def test_no_module_walks_stack_frames():
    offenders = _offenders(frame_walks)
    assert not offenders, _message("ag observes the engine through hooks' events; no module reads a caller's "
                                   "frame", offenders)


def test_the_rules_read_every_module_of_the_package():
    paths = {_relative(p) for p in SOURCES}
    assert {"ag/__init__.py", "ag/ops/__init__.py", "ag/ops/reductions.py", "ag/cli.py", "ag/remat/graphs/dtr.py",
            "ag/course/assign.py"} <= paths
    assert {"ag", "ag.ops", "ag.ops.reductions", "ag.remat", "ag.remat.graphs.dtr", "ag.plot.labels"} <= MODULES


# ---- each rule can fail: checked on small sources ----

SMALL = frozenset({"ag", "ag.trace", "ag.demo", "ag.cli", "ag.remat", "ag.remat.runner", "ag.remat.dtr",
                   "ag.plot", "ag.plot.labels", "ag.course", "ag.course._stubbed", "ag.course.assign"})


def test_upper_imports_finds_relative_absolute_and_from_package_forms():
    source = "import ag.demo\nfrom ag.cli import main\nfrom . import demo\nfrom .demo import table\n"
    assert upper_imports("ag/parallel.py", source) == [
        "ag/parallel.py:1: imports ag.demo", "ag/parallel.py:2: imports ag.cli",
        "ag/parallel.py:3: imports ag.demo", "ag/parallel.py:4: imports ag.demo"]
    assert upper_imports("ag/remat/sweep.py", "def f():\n    from ..cli import main\n") == [
        "ag/remat/sweep.py:2: imports ag.cli"]
    assert upper_imports("ag/parallel.py", "import ag.trace\nfrom . import trace\nfrom .demos import x\n") == []


def test_private_uses_finds_imports_and_module_attributes():
    source = ("from .runner import Layer, _Chain\n"
              "from .. import trace\n"
              "from ..plot import labels\n"
              "import ag\n"
              "def f():\n"
              "    trace._device_module()\n"
              "    return labels._renderer, ag.plot.labels._renderer\n")
    assert private_uses("ag/remat/dtr.py", source, SMALL) == [
        "ag/remat/dtr.py:1: imports _Chain from ag.remat.runner",
        "ag/remat/dtr.py:6: uses ag.trace._device_module",
        "ag/remat/dtr.py:7: uses ag.plot.labels._renderer"]
    assert private_uses("ag/remat/__init__.py", "from .runner import _check\n", SMALL) == [
        "ag/remat/__init__.py:1: imports _check from ag.remat.runner"]


def test_private_uses_passes_objects_own_names_and_package_private_modules():
    source = ("from .. import trace\n"
              "def f(tensor, trace):\n"
              "    return tensor._needed_by, trace._anything\n"
              "def g(x):\n"
              "    return x._value, _local()\n"
              "def _local():\n"
              "    return trace.__name__\n"
              "import numpy as np\n"
              "np._private\n")
    assert private_uses("ag/remat/dtr.py", source, SMALL) == []
    assert private_uses("ag/course/assign.py", "from . import _stubbed\nfrom ._stubbed import X\n", SMALL) == []
    assert private_uses("ag/remat/dtr.py", "from ..course import _stubbed\n", SMALL) == [
        "ag/remat/dtr.py:1: imports _stubbed from ag.course"]


def test_shadowed_builtins_finds_defs_assignments_and_imports_at_module_level_only():
    source = ("from .ops import sum, matmul\n"
              "def max(x):\n    len = 3\n    return len\n"
              "abs = 1\n"
              "if True:\n    type = str\n"
              "class C:\n    min = 0\n")
    assert shadowed_builtins("ag/demo.py", source) == [
        "ag/demo.py:1: binds the built-in sum", "ag/demo.py:2: binds the built-in max",
        "ag/demo.py:5: binds the built-in abs", "ag/demo.py:7: binds the built-in type"]
    assert shadowed_builtins("ag/demo.py", "from . import ops\ntotal = ops.sum\n") == []


def test_builtins_uses_finds_the_import_and_its_attributes():
    assert builtins_uses("ag/ops/reductions.py", "import builtins\nbuiltins.max(1, 2)\n") == [
        "ag/ops/reductions.py:1: imports builtins", "ag/ops/reductions.py:2: uses builtins.max"]
    assert builtins_uses("ag/ops/reductions.py", "def sum(x):\n    return x\n") == []


def test_frame_walks_finds_getframe_inspect_stack_and_frame_attributes_but_not_np_stack():
    source = ("import sys, inspect\nfrom sys import _getframe\nf = sys._getframe(3)\nup = f.f_back\n"
              "names = up.f_locals\nwho = inspect.stack()\nrows = np.stack(rows)\nstack = []\n")
    assert frame_walks("m.py", source) == [
        "m.py:2: imports _getframe from sys", "m.py:3: reads sys._getframe", "m.py:4: reads f.f_back",
        "m.py:5: reads up.f_locals", "m.py:6: reads inspect.stack"]


# ---- the README's module map is the import graph ----

def _unit(module: str) -> str:
    """A top-level module or subpackage of ag: ``ag.remat.dtr`` is ``remat``."""
    return module.split(".")[1] if module.count(".") else module


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``: they cost nothing at run time."""
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            hidden |= {id(n) for child in node.body for n in ast.walk(child)}
    return hidden


def module_map() -> dict[str, set[str]]:
    """Each top-level module or subpackage of ag, and the others it imports (anywhere in it)."""
    uses: dict[str, set[str]] = {}
    for path in SOURCES:
        name = _relative(path)
        unit = _unit(_module_of(name))
        if unit in ("ag", "__main__"):
            continue
        tree = ast.parse(path.read_text())
        hidden = _type_checking_only(tree)
        targets = uses.setdefault(unit, set())
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.ImportFrom):
                source = _imported_from(name, node)
                modules = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            targets |= {_unit(m) for m in modules if _is_ag(m) and m != "ag"} - {unit}
    return uses


def _readme_map() -> dict[str, set[str]]:
    """The module map in ``ag/__init__.py``'s docstring (the README points there)."""
    block = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text())).split("<!-- module map -->", 2)[1]
    rows = [line.split("|")[1:3] for line in block.splitlines() if line.startswith("| `")]
    return {name.strip(" `/"): {u.strip(" `/") for u in used.split(",") if u.strip() not in ("", "—")}
            for name, used in rows}


def test_the_readme_module_map_is_the_import_graph():
    assert _readme_map() == module_map()


def test_every_module_uses_only_modules_above_it_in_the_readme_map():
    order = list(_readme_map())
    upward = {(user, used) for user, uses in _readme_map().items() for used in uses
              if order.index(used) > order.index(user)}
    assert upward == set()


# ---- rule e: no import circles among modules, and no import of ag hidden inside a function ----

# (file, the ag module it imports inside a function): why it waits for the call
OPTIONAL_IMPORTS = {("ag/attention/flash.py", "ag.attention.gpu"): "CuPy, which backend='cupy' alone needs"}


def _ag_modules_imported(path: str, node: ast.Import | ast.ImportFrom, modules: frozenset[str]) -> set[str]:
    """The ag modules (of ``modules``) an import binds or runs: ``from .. import hooks`` in
    ``ag/ops/x.py`` is ag.hooks."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        source = _imported_from(path, node)
        names = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
    return {name for name in names if _is_ag(name) and name in modules}


def import_edges(sources: dict[str, str]) -> dict[str, set[str]]:
    """Each module of ``sources`` ({path: source}) and the ag modules it imports anywhere in it, but
    the edges between a package and its own modules (a package re-exports what its modules define)."""
    edges, modules = {}, frozenset(_module_of(path) for path in sources)
    for path, source in sources.items():
        module, tree = _module_of(path), ast.parse(source)
        hidden = _type_checking_only(tree)
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in hidden:
                found |= _ag_modules_imported(path, node, modules)
        edges[module] = {m for m in found if m != module and not module.startswith(m + ".")
                         and not (path.endswith("__init__.py") and m.startswith(module + "."))}
    return edges


def import_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The modules that reach themselves through ``edges``, as one sorted list per circle."""
    def reach(start: str) -> set[str]:
        seen, stack = set(), list(edges.get(start, ()))
        while stack:
            module = stack.pop()
            if module not in seen:
                seen.add(module)
                stack.extend(edges.get(module, ()))
        return seen
    reached = {module: reach(module) for module in edges}
    circles = {tuple(sorted(m for m in reached[module] if module in reached[m]))
               for module in edges if module in reached[module]}
    return sorted(map(list, circles))


def imports_inside_functions(path: str, source: str, modules: frozenset[str] = MODULES) -> list[tuple[str, str]]:
    """(``file:line``, module) of every import of an ag module (of ``modules``) inside a function."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found += [(f"{path}:{node.lineno}", m) for m in sorted(_ag_modules_imported(path, node, modules))]
    return sorted(set(found))


def test_no_module_reaches_itself_through_imports():
    sources = {_relative(p): p.read_text() for p in SOURCES}
    assert import_circles(import_edges(sources)) == []


def test_imports_of_ag_inside_functions_are_only_for_optional_dependencies():
    found = {(site.partition(":")[0], module) for path in SOURCES
             for site, module in imports_inside_functions(_relative(path), path.read_text())}
    assert found <= set(OPTIONAL_IMPORTS), sorted(found - set(OPTIONAL_IMPORTS))
    assert len(OPTIONAL_IMPORTS) <= 3


def test_import_circles_finds_a_circle_through_a_function_level_import_and_not_a_package_reexport():
    sources = {"ag/remat/graph.py": "from .execute import run\n",
               "ag/remat/execute.py": "def f():\n    from .model import simulate\n",
               "ag/remat/model.py": "from . import graph\n",
               "ag/remat/__init__.py": "from .graph import x\n",
               "ag/tensor.py": "import numpy\n"}
    edges = import_edges(sources)
    assert edges["ag.remat"] == set() and edges["ag.remat.execute"] == {"ag.remat.model"}
    assert import_circles(edges) == [["ag.remat.execute", "ag.remat.graph", "ag.remat.model"]]
    assert imports_inside_functions("ag/remat/execute.py", sources["ag/remat/execute.py"], frozenset(edges)) == [
        ("ag/remat/execute.py:2", "ag.remat.model")]
