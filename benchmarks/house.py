"""The house, measured: what issue 49 asks of the code a student reads, from ag's own source.

    python benchmarks/house.py          # one table
    python benchmarks/house.py --json   # the same, as JSON

- lines of code of ag/ without the lab (blank lines, comments and docstrings not counted);
- the engine core (tensor, tensor_base, arrays, modes, hooks, discard, errors, handover or its successor)
  plus the ops' classroom path (ag/ops), and attention's classroom path (ag/attention without gpu.py);
- the 10 longest functions of the classroom path;
- import circles between ag's modules, and imports of ag's own modules inside functions;
- comments and docstrings that cite a benchmark figure (a time, a ratio or a speed-up).
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ag"
CORE = ("tensor", "tensor_base", "arrays", "modes", "hooks", "discard", "errors", "handover", "grads", "events")
# a figure a benchmark produced: "0.47 -> 0.28 us", "1305-1316 against 1264 ms", "3 to 4% slower", "1.2 x torch"
FIGURE = re.compile(r"\d[\d.]*\s*(?:ms|us|µs|ns|s\b|%|x\b|×)|\d[\d.]*\s*(?:->|→)\s*\d", re.IGNORECASE)


def sources(lab: bool = False) -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if "__pycache__" not in p.parts and (lab or "lab" not in p.relative_to(PACKAGE).parts))


def code_lines(path: Path) -> int:
    """Lines holding code: not blank, not only a comment, not inside a docstring."""
    text = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                              tokenize.DEDENT, tokenize.ENDMARKER):
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, bool, int]]:
    """(ag module imported, whether the import is inside a function, its line) for each import of ag's own."""
    tree, here = ast.parse(path.read_text()), module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    inside = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "ag"]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [module] if module.split(".")[0] == "ag" else []
            names += [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES]
        else:
            continue
        found += [(n, id(node) in inside, node.lineno) for n in names]
    return found


MODULES = {module_name(p) for p in sources(lab=True)}


def circles(paths: list[Path], *, hidden: bool = False) -> list[list[str]]:
    """Import circles (strongly connected components of more than one module): at module level, or
    with ``hidden`` also through the imports inside functions."""
    graph = {module_name(p): {m for m, inner, _ in imports(p) if (hidden or not inner) and m in MODULES
                              and m != module_name(p)} for p in paths}
    for name, targets in graph.items():  # importing ag.x.y runs ag.x's __init__ too, but a package's face is not a circle
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def functions(paths: list[Path]) -> list[tuple[int, str]]:
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.name}"))
    return sorted(out, reverse=True)


def benchmark_citations(paths: list[Path]) -> list[str]:
    """Comments and docstrings that quote a measured time, ratio or speed-up."""
    found = []
    for path in paths:
        text = path.read_text()
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.COMMENT, tokenize.STRING) and token.string.lstrip("rbuRBU").startswith(('"""', "#")):
                for offset, line in enumerate(token.string.splitlines()):
                    if FIGURE.search(line) and re.search(r"slower|faster|against|torch|speed|took|bench|->|→", line):
                        found.append(f"{path.relative_to(ROOT)}:{token.start[0] + offset}")
    return found


def measure() -> dict:
    paths = sources()
    classroom_ops = [p for p in paths if p.parent.name == "ops"]
    core = [p for p in paths if p.parent == PACKAGE and p.stem in CORE]
    attention = [p for p in paths if p.parent.name == "attention" and p.stem != "gpu"]
    classroom = core + classroom_ops + attention
    inner = sorted({f"{p.relative_to(ROOT)}:{line}" for p in sources(lab=True) for _, inside, line in imports(p)
                    if inside})
    return {
        "ag lines (no lab)": sum(code_lines(p) for p in paths),
        "engine core + ops": sum(code_lines(p) for p in core + classroom_ops),
        "attention (NumPy)": sum(code_lines(p) for p in attention),
        "longest classroom functions": [f"{n} {name}" for n, name in functions(classroom)[:10]],
        "import circles": circles(sources(lab=True)),
        "import circles through imports inside functions": circles(sources(lab=True), hidden=True),
        "imports of ag's own inside functions": inner,
        "comments citing a benchmark": benchmark_citations(sources()),
        "README lines": len((ROOT / "README.md").read_text().splitlines()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    figures = measure()
    if parser.parse_args().json:
        print(json.dumps(figures, indent=1))
        return
    for key, value in figures.items():
        if isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"    {item}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
