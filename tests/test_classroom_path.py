"""The classroom path is the lecture's code: stepping through ``loss.backward()`` lands in the
engine and the ops' closures, and the ops' source holds no lab (threads, blocks, benchmark figures)."""
from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import ag

AG = Path(ag.__file__).resolve().parent
OPS_SOURCES = sorted((AG / "ops").glob("*.py"))


def ag_code_entered_in_backward_of_relu_of_matmul() -> dict[str, set[str]]:
    """{file under ag/: the functions entered} while ``relu(x @ w).backward(seed)`` runs."""
    x = ag.Tensor(np.random.default_rng(0).standard_normal((4, 3)), requires_grad=True)
    w = ag.Tensor(np.random.default_rng(1).standard_normal((3, 2)), requires_grad=True)
    y = ag.relu(ag.matmul(x, w))
    seed = np.ones(y.shape)
    entered: dict[str, set[str]] = {}

    def tracer(frame, event, arg):
        path = Path(frame.f_code.co_filename)
        if AG in path.parents:
            entered.setdefault(path.relative_to(AG).as_posix(), set()).add(frame.f_code.co_name)
    sys.settrace(tracer)
    try:
        y.backward(seed)
    finally:
        sys.settrace(None)
    return entered


def test_backward_of_one_matmul_and_one_relu_enters_the_two_ops_closures_and_no_other_op_code():
    """Of ag/ops/, only the two closures run (and matmul's own product helpers)."""
    assert not ag.lab.enabled()
    entered = ag_code_entered_in_backward_of_relu_of_matmul()
    ops = {f: names for f, names in entered.items() if f.startswith("ops/")}
    assert ops == {"ops/matmul.py": {"_backward", "_product", "_as_matrix"}, "ops/unary.py": {"_backward"}}, ops


def test_backward_of_one_matmul_and_one_relu_enters_tensor_py_and_the_two_ops_files_and_nothing_else():
    assert set(ag_code_entered_in_backward_of_relu_of_matmul()) == {"tensor.py", "ops/matmul.py", "ops/unary.py"}


def test_the_lab_entered_no_frame_of_the_classroom_backward():
    with ag.lab.on():
        entered = ag_code_entered_in_backward_of_relu_of_matmul()
    assert any(f.startswith("lab/") for f in entered), "the lab's variants did not run with the lab on"
    assert not any(f.startswith("lab/") for f in ag_code_entered_in_backward_of_relu_of_matmul())


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", OPS_SOURCES, ids=lambda p: p.name)
def test_no_op_module_imports_the_lab_or_a_thread_pool(path):
    offenders = {m for m in _imports(path) if re.search(r"(^|\.)(lab|threads|threading|concurrent)(\.|$)", m)}
    assert not offenders, f"{path.name} imports {sorted(offenders)}: the lab plugs in through ag.ops.kernels"


PUBLISHERS = sorted([AG / name for name in ("tensor.py", "tensor_base.py", "arrays.py", "modes.py", "hooks.py",
                                             "discard.py", "errors.py")]
                    + list((AG / "ops").glob("*.py")) + list((AG / "attention").glob("*.py")))


def _imported_names(path: Path) -> set[str]:
    """What ``path`` imports, each name joined to its module: ``from .. import trace`` gives "...trace"."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", PUBLISHERS, ids=lambda p: p.relative_to(AG).as_posix())
def test_the_engine_ops_and_attention_publish_events_and_import_no_observer(path):
    """Observation is events: ``trace`` (and ``count_ops`` in it) and ``remat``'s capture subscribe to
    ``hooks``; the code that publishes imports neither."""
    offenders = {m for m in _imported_names(path) if re.search(r"(^|\.)(trace|remat)(\.|$)", m)}
    assert not offenders, f"{path.relative_to(AG)} imports {sorted(offenders)}: publish through ag.hooks instead"


def test_the_observer_pattern_finds_every_form_of_import(tmp_path):
    for line in ("from ..trace import count_matmul", "from .. import trace", "import ag.trace", "from ag import remat"):
        (tmp_path / "x.py").write_text(line + "\n")
        assert any(re.search(r"(^|\.)(trace|remat)(\.|$)", m) for m in _imported_names(tmp_path / "x.py")), line


BENCHMARK_FIGURE = re.compile(r"\d\s*(ms|µs|us|ns)\b|\d+(\.\d+)?\s*%|\d+(\.\d+)?\s*(x|×)\s+(as|faster|slower)|->\s*\d")


@pytest.mark.parametrize("path", OPS_SOURCES, ids=lambda p: p.name)
def test_no_comment_or_docstring_in_the_ops_cites_a_benchmark_figure(path):
    lines = [(i, line) for i, line in enumerate(path.read_text().splitlines(), 1) if BENCHMARK_FIGURE.search(line)]
    assert not lines, f"{path.name} cites timings (docs/lab.md and BENCHMARKS.md keep them): {lines}"


@pytest.mark.parametrize("path", OPS_SOURCES, ids=lambda p: p.name)
def test_no_function_in_the_ops_is_over_40_lines(path):
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 40]
    assert not long, f"{path.name}: {long}"


def test_the_figure_pattern_finds_the_figures_it_is_for():
    for cited in ("0.47 -> 0.28 us", "took 0.43 ms", "3 to 4% slower", "14 × as slow"):
        assert BENCHMARK_FIGURE.search(cited), cited
    assert not BENCHMARK_FIGURE.search("y = x/2 · (1 + tanh(c(x + 0.044715 x³)))")


def test_flash_attention_on_the_classroom_path_runs_the_papers_loops_on_one_thread_with_blas_on_one(monkeypatch):
    """Issue 49: NumPy's flash is ``tiled_forward`` and ``tiled_backward`` on the caller's thread,
    with BLAS held to one thread while they run (a tile's small products stall a threaded BLAS)."""
    import threading

    threadpoolctl = pytest.importorskip("threadpoolctl", reason="holding BLAS to one thread needs the fast extra")
    flash_module = sys.modules["ag.attention.flash"]
    seen = []

    def watched(name, loop):
        def run(*args, **kwargs):
            blas = {i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}
            seen.append((name, blas, threading.active_count(), threading.current_thread() is threading.main_thread()))
            return loop(*args, **kwargs)
        return run
    monkeypatch.setattr(flash_module, "tiled_forward", watched("forward", flash_module.tiled_forward))
    monkeypatch.setattr(flash_module, "tiled_backward", watched("backward", flash_module.tiled_backward))
    rng = np.random.default_rng(0)
    q, k, v = (ag.Tensor(rng.standard_normal((1, 2, 300, 16)), requires_grad=True) for _ in range(3))
    threads = threading.active_count()
    ag.sum(ag.attention.flash_attention(q, k, v, causal=True)).backward()
    assert [name for name, *_ in seen] == ["forward", "backward"]
    assert all(blas <= {1} and count == threads and main for _, blas, count, main in seen), seen
    want = [ag.Tensor(t.value, requires_grad=True) for t in (q, k, v)]
    ag.sum(ag.attention.naive_attention(*want, causal=True)).backward()
    for got, ref in zip((q, k, v), want):
        np.testing.assert_allclose(got.grad, ref.grad, rtol=1e-9, atol=1e-12)
