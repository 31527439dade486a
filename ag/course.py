"""The course kit: exercises cut from ag's own source, and a grader that TAs can trust.

The source of truth is ag itself: the parts students write are marked in the library
with ``### BEGIN SOLUTION`` / ``### END SOLUTION`` (the nbgrader convention). ``assign``
copies each exercise's functions out of ag into ``exercises/exN_name.py`` with every
marked region replaced by ``# YOUR CODE HERE`` and ``raise NotImplementedError()``, and
into ``solutions/`` with the markers dropped. ``install`` puts a student's functions back
into ag, so an exercise runs against the real engine.

``grade`` runs the graded tests (``tests/grading``, each marked ``points(n)``) on a
student's folder, every test in its own process with a timeout, and writes Gradescope's
results format. Code that raises, hangs, prints megabytes or exits costs that test only.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
REPO = Path(__file__).resolve().parent.parent
PACKAGE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Exercise:
    """One homework: functions copied out of ag modules, a statement and its sanity checks."""

    number: int
    name: str
    title: str
    statement: str
    functions: tuple[tuple[str, str], ...]  # (module under ag, function name)
    imports: str
    checks: str
    expected: str

    @property
    def filename(self) -> str:
        return f"ex{self.number}_{self.name}.py"

    @property
    def module_name(self) -> str:
        return f"ex{self.number}_{self.name}"


EXERCISES = (
    Exercise(
        1, "discard_grad", "Discarding the grad",
        "A grad buffer costs as much as its value. Allocate it lazily, the first time something "
        "flows into it (accumulate_grad, which the backward of matmul and sum call), and free a "
        "non-leaf tensor's grad right after its own backward step (the loop in backward).",
        (("tensor", "accumulate_grad"), ("tensor", "backward")),
        "import numpy as np\n\nfrom ag import trace\nfrom ag.tensor import (GraphError, Tensor, _array, _free_graph, "
        "_record_step, _run_step,\n                       _seed_grad, _step, config, topological_sort, "
        "unbroadcast)",
        "from ag import course, demo\ncourse.install(__name__)\nrun = demo.matmul_chain(4096, 5, eager=False)\n"
        "print('forward MB:', [s.allocated_mb for s in run.forward])\n"
        "print('backward MB:', [s.allocated_mb for s in run.backward])",
        "forward MB: [32, 65, 98, 131, 163]\nbackward MB: [196, 171, 147, 122, 97, 40]"),
    Exercise(
        2, "rematerialize", "Rematerialization in the backward loop",
        "Task 1: before a backward step, give every value the step reads (node._saved, and the node "
        "itself if node._saves_output) that was discarded its value back, by calling "
        "rematerialize. Task 2: a tensor with a rematerializer is not a checkpoint: write "
        "discard_value_if_has_rematerializer, and call it after the last step that reads a value.",
        (("tensor", "_run_step"), ("tensor", "discard_value_if_has_rematerializer")),
        "from ag.tensor import Tensor, _phase, _step, rematerialize",
        "import numpy as np\nimport ag\nfrom ag import course, remat\ncourse.install(__name__)\n"
        "rng = np.random.default_rng(0)\nws = [ag.Tensor(rng.standard_normal((8, 8)) / 3, requires_grad=True) "
        "for _ in range(10)]\nlayers = [lambda h, w=w: h @ w for w in ws]\nx = ag.Tensor(rng.standard_normal((4, 8)))\n"
        "with ag.count_ops() as counts:\n    ag.sum(remat.sequential(layers, x, [5], mode='tensor')).backward()\n"
        "print(counts)",
        "matmuls: forward 10, recompute 21, backward 19 (total 50); FLOPs: 25,600"),
    Exercise(
        3, "online_softmax", "Online softmax: merging two blocks",
        "softmax_block gives one block's softmax(s) @ v with its row max m and normalizer l. Write "
        "merge_softmax_blocks: the softmax over both blocks' columns, from the two results alone "
        "(rescale each normalizer to the new max; weight each output by its share of the total).",
        (("attention", "merge_softmax_blocks"),),
        "import numpy as np\n\nfrom ag.attention import SoftmaxBlock",
        "import numpy as np\nfrom ag import course\nfrom ag.attention import softmax_block\n"
        "course.install(__name__)\nrng = np.random.default_rng(0)\ns, v = rng.standard_normal((3, 8)), "
        "rng.standard_normal((8, 2))\nmerged = merge_softmax_blocks(softmax_block(s[:, :3], v[:3]), "
        "softmax_block(s[:, 3:], v[3:]))\np = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)\n"
        "print('matches softmax(s) @ v:', np.allclose(merged.o, p @ v))",
        "matches softmax(s) @ v: True"),
    Exercise(
        4, "flash_forward", "Tiled attention forward",
        "Write the inner loop of FlashAttention-2's forward: for one query tile q_i, stream the key/value "
        "tiles, keep the running max m_i, the running sum l_i and the unscaled accumulator acc, divide "
        "once at the end, and store the row logsumexp m_i + log l_i. q_i comes scaled (scale * Q_i); "
        "tiles.scores(q_i, k_j, q_start, k_start) gives the masked score tile; tiles.key_tiles the key "
        "tiles a query tile can see.",
        (("attention", "tiled_forward"),),
        "import numpy as np\n\nfrom ag.attention import _Tiles",
        "import numpy as np\nfrom ag import course\nfrom ag.attention import flash_attention, naive_attention\n"
        "course.install(__name__)\nrng = np.random.default_rng(0)\nq, k, v = (rng.standard_normal((1, 2, 50, 8)) "
        "for _ in range(3))\nout = flash_attention(q, k, v, causal=True, block_q=16, block_k=16)\n"
        "print('equals naive:', np.allclose(out, naive_attention(q, k, v, causal=True)))",
        "equals naive: True"),
    Exercise(
        5, "flash_backward", "Tiled attention backward by recomputation",
        "Write FlashAttention-2's backward: D = rowsum(dO * O); for each key/value tile and each query "
        "tile that sees it (tiles.query_tiles), take q_i = tiles.scaled_queries(qg, rows) = scale * Q_i, "
        "recompute P = exp(S - L) from tiles.scores and the saved logsumexp L, then dV += P^T dO, "
        "dP = dO V^T, dS = P * (dP - D), dQ += dS K, dK += dS^T q_i, writing into dqg, dkg and dvg "
        "(dq is multiplied by scale once after your loop; for GQA, _group_sum sums dK and dV over the "
        "group axis -3).",
        (("attention", "tiled_backward"),),
        "import numpy as np\n\nfrom ag.attention import _Tiles, _group_sum",
        "import numpy as np\nimport ag\nfrom ag import course\nfrom ag.attention import flash_attention, "
        "naive_attention\ncourse.install(__name__)\nrng = np.random.default_rng(0)\n"
        "arrays = [rng.standard_normal((1, 2, 40, 8)) for _ in range(3)]\ngrads = []\n"
        "for attention in (naive_attention, flash_attention):\n    ts = [ag.Tensor(a, requires_grad=True) "
        "for a in arrays]\n    ag.sum(attention(*ts, causal=True)).backward()\n    grads.append([t.grad for t in ts])\n"
        "print('gradients equal naive:', all(np.allclose(a, b) for a, b in zip(*grads)))",
        "gradients equal naive: True"),
    Exercise(
        6, "checkpoint_plan", "Choosing checkpoints",
        "Write the sqrt strategy of plan (keep every floor(sqrt(n))-th output, through _every) and the "
        "dynamic program of _optimal: for each last kept output c and each Pareto-optimal (bytes kept, "
        "FLOPs) prefix, try every next kept output j (or none, j = n) whose local peak fits the budget.",
        (("remat", "plan"), ("remat", "_optimal")),
        "import math\n\nimport numpy as np\n\nfrom ag.remat import (STRATEGIES, _check_checkpoints, _every, _greedy, "
        "_local_peak,\n                      _num_layers, _pareto, as_profile)",
        "from ag import course, remat\ncourse.install(__name__)\nprint('sqrt of 64:', remat.plan(64, 'sqrt'))\n"
        "chain = remat.as_profile([4, 1, 1, 4, 1, 1, 4, 1])\n"
        "print('optimal at 12:', remat.plan(8, 'optimal', chain=chain, budget_bytes=12))",
        "sqrt of 64: [7, 15, 23, 31, 39, 47, 55]\noptimal at 12: [1, 2, 5, 6]"),
)


# ---- generating exercises and solutions ----

def _function_source(module: str, name: str) -> str:
    """The source of ``ag.<module>.<name>``, read from the file (decorators included)."""
    path = PACKAGE / f"{module}.py"
    text = path.read_text()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            lines = text.splitlines()
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            stop = node.end_lineno
            while stop < len(lines) and lines[stop].strip() == END:  # a region closing the function
                stop += 1
            return "\n".join(lines[start:stop]) + "\n"
    raise LookupError(f"assign: no function {name!r} in ag/{module}.py")


def cut_solutions(source: str, *, keep: bool) -> str:
    """Drop the markers; with ``keep=False`` also replace each marked region by the stub."""
    out, inside = [], False
    for number, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"line {number}: {BEGIN} inside another solution region")
            inside = True
            if not keep:
                indent = line[: len(line) - len(line.lstrip())]
                out.extend(indent + s for s in STUB)
        elif stripped == END:
            if not inside:
                raise ValueError(f"line {number}: {END} without {BEGIN}")
            inside = False
        elif keep or not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{BEGIN} is never closed")
    return "\n".join(out) + "\n"


def render(exercise: Exercise, *, solution: bool) -> str:
    """The text of one exercise file (a student's copy, or the solution)."""
    sources = [cut_solutions(_function_source(m, f), keep=solution) for m, f in exercise.functions]
    origin = ", ".join(sorted({f"ag/{m}.py" for m, _ in exercise.functions}))
    kind = "Solution" if solution else "Exercise"
    statement = textwrap.fill(exercise.statement, 92)
    expected = textwrap.indent(exercise.expected, "    ")
    checks = textwrap.indent(exercise.checks, "    ")
    return (f'"""{kind} {exercise.number}: {exercise.title}.\n\n{statement}\n\n'
            f"Fill in every `# YOUR CODE HERE`. Check yourself with\n"
            f"    python {'solutions' if solution else 'exercises'}/{exercise.filename}\n"
            f"which should print\n{expected}\n\n"
            f"Generated by `ag assign` from {origin}; the graded tests are in tests/grading/.\n"
            f'"""\nfrom __future__ import annotations\n\n{exercise.imports}\n\n\n' + "\n\n".join(sources) +
            f'\n\nif __name__ == "__main__":\n{checks}\n')


def assign(root: Path | str | None = None, *, check: bool = False) -> list[Path]:
    """Write (or, with ``check``, compare) exercises/ and solutions/; return the files that differ."""
    root = Path(root) if root else REPO
    stale = []
    for folder, solution in (("exercises", False), ("solutions", True)):
        for exercise in EXERCISES:
            path = root / folder / exercise.filename
            text = render(exercise, solution=solution)
            if path.exists() and path.read_text() == text:
                continue
            stale.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return stale


# ---- running a student's functions inside ag ----

def install(module, setter=setattr) -> list[str]:
    """Put an exercise module's functions into ag in place of the library's own.

    Every ag module that holds the library function under that name gets the student's one,
    so ``ag.matmul`` calls the student's ``accumulate_grad``. Returns the names installed.
    Tests pass ``monkeypatch.setattr`` as ``setter`` so that ag is restored afterwards.
    """
    if isinstance(module, str):
        module = sys.modules[module]
    exercise = _exercise_of(module)
    installed = []
    for module_name, name in exercise.functions:
        library = importlib.import_module(f"ag.{module_name}")
        original = getattr(library, name)
        replacement = getattr(module, name)
        for loaded in [m for n, m in list(sys.modules.items()) if n == "ag" or n.startswith("ag.")]:
            if getattr(loaded, name, None) is original:
                setter(loaded, name, replacement)
        installed.append(name)
    return installed


def _exercise_of(module) -> Exercise:
    stem = Path(getattr(module, "__file__", "") or "").stem or module.__name__
    for exercise in EXERCISES:
        if stem == exercise.module_name or module.__name__.endswith(exercise.module_name):
            return exercise
    raise LookupError(f"install: {module.__name__} is not one of the exercises "
                      f"({', '.join(e.module_name for e in EXERCISES)})")


def load_submission(folder: Path | str, exercise: Exercise):
    """Import a student's exercise file from ``folder`` as a fresh module."""
    path = Path(folder) / exercise.filename
    if not path.exists():
        raise FileNotFoundError(f"no {exercise.filename} in {folder}")
    spec = importlib.util.spec_from_file_location(exercise.module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[exercise.module_name] = module
    spec.loader.exec_module(module)
    return module


# ---- grading ----

@dataclass
class TestResult:
    name: str
    max_score: float
    score: float = 0.0
    status: str = "failed"
    output: str = ""
    visibility: str = "visible"
    seconds: float = 0.0


@dataclass
class Report:
    tests: list[TestResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)

    def gradescope(self) -> dict:
        """Gradescope's results.json: score, max_score, execution_time, tests[...]."""
        return {
            "score": self.score,
            "max_score": self.max_score,
            "execution_time": round(self.seconds, 2),
            "visibility": "visible",
            "stdout_visibility": "hidden",
            "tests": [{"name": t.name, "score": t.score, "max_score": t.max_score, "status": t.status,
                       "output": t.output, "visibility": t.visibility} for t in self.tests],
        }


MAX_OUTPUT = 10_000

# What ``ag grade --json`` writes: the subset of Gradescope's results.json that ag fills in.
RESULTS_SCHEMA = {
    "type": "object",
    "required": ["score", "max_score", "execution_time", "tests"],
    "properties": {
        "score": {"type": "number", "minimum": 0},
        "max_score": {"type": "number", "minimum": 0},
        "execution_time": {"type": "number", "minimum": 0},
        "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "stdout_visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "tests": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "score", "max_score", "status", "output", "visibility"],
                "properties": {
                    "name": {"type": "string"},
                    "score": {"type": "number", "minimum": 0},
                    "max_score": {"type": "number", "minimum": 0},
                    "status": {"enum": ["passed", "failed"]},
                    "output": {"type": "string", "maxLength": 12_000},
                    "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}


def collect(tests: Path) -> list[dict]:
    """The graded tests under ``tests`` with their points and visibility, via pytest."""
    with _temp_json() as out:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", str(tests), "--collect-only", "-q", "-p", "ag.grading_plugin",
             "-p", "no:cacheprovider"], capture_output=True, text=True,
            env={**os.environ, "AG_GRADING_COLLECT": str(out)}, timeout=300)
        if proc.returncode not in (0, 5) or not out.exists():
            raise RuntimeError(f"grade: could not collect the tests in {tests}:\n{proc.stdout[-3000:]}"
                               f"{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def grade(submission: Path | str, tests: Path | str | None = None, *, timeout: float = 60.0) -> Report:
    """Run every graded test on the student folder ``submission``, each in its own process."""
    tests = Path(tests) if tests else REPO / "tests" / "grading"
    submission = Path(submission).resolve()
    started = time.perf_counter()
    report = Report()
    for item in collect(tests):
        result = TestResult(item["name"], float(item["points"]), visibility=item["visibility"])
        t0 = time.perf_counter()
        result.status, result.output = _run_one(item["nodeid"], submission, tests, timeout)
        result.seconds = time.perf_counter() - t0
        result.score = result.max_score if result.status == "passed" else 0.0
        report.tests.append(result)
    report.seconds = time.perf_counter() - started
    return report


def _run_one(nodeid: str, submission: Path, tests: Path, timeout: float) -> tuple[str, str]:
    cmd = [sys.executable, "-m", "pytest", nodeid, "-q", "-x", "--no-header", "-p", "no:cacheprovider",
           "-p", "ag.grading_plugin", "--tb=short"]
    env = {**os.environ, "AG_SUBMISSION": str(submission), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, env=env, timeout=timeout, cwd=tests.parent.parent)
    except subprocess.TimeoutExpired as expired:
        return "failed", f"timed out after {timeout:g} s\n" + _clip((expired.stdout or b"").decode(errors="replace"))
    text = _clip(proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace"))
    if proc.returncode == 0:
        return "passed", ""
    return "failed", text or f"the test process ended with exit code {proc.returncode}"


def _clip(text: str) -> str:
    if len(text) <= MAX_OUTPUT:
        return text
    return text[:MAX_OUTPUT // 2] + f"\n... [{len(text) - MAX_OUTPUT:,} characters cut] ...\n" + text[-MAX_OUTPUT // 2:]


class _temp_json:
    def __enter__(self) -> Path:
        import tempfile
        self.dir = tempfile.TemporaryDirectory()
        return Path(self.dir.name) / "collected.json"

    def __exit__(self, *exc) -> None:
        self.dir.cleanup()


# ---- a Gradescope autograder bundle ----

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once when it builds the autograder image.
set -euo pipefail
apt-get update -qq && apt-get install -y -qq python3 python3-pip > /dev/null
python3 -m pip install --quiet /autograder/source/ag-src pytest pytest-timeout
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission; the student's files are in /autograder/submission.
set -uo pipefail
mkdir -p /autograder/results
cd /autograder/source
python3 -m ag grade /autograder/submission --tests /autograder/source/tests/grading \\
    --json /autograder/results/results.json
"""


def autograder_bundle(path: Path | str, *, root: Path | str = REPO) -> Path:
    """Write Gradescope's autograder zip: setup.sh, run_autograder, ag's source and the graded tests."""
    root, path = Path(root), Path(path)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER)):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            bundle.writestr(info, text)
        for file in sorted((root / "ag").rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts:
                bundle.write(file, Path("ag-src") / file.relative_to(root))
        for extra in ("pyproject.toml", "README.md"):
            bundle.write(root / extra, Path("ag-src") / extra)
        for file in sorted((root / "tests" / "grading").rglob("*.py")):
            bundle.write(file, file.relative_to(root))
    return path
