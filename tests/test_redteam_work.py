"""The red team, round two: submissions that skip the work and try to pass anyway.

Each case copies solutions/ and replaces ONE exercise file by the student's stub (exercises/)
with one function written the lazy way: merging two softmax blocks by returning the first, the
optimal plan by searching every plan, the flash loops by calling naive attention copied from the
public references (tests/grading/references/) over every key, over only the keys a query can
see, over each query tile's whole row of keys in turn, or over the keys that are not 0 (the
rest counted), the lecture's memory table and the recomputation count by patching ag's own
``demo.matmul_chain``, ``trace`` and ``count_ops`` from the module. Each is graded once through
the CLI and must score 0 on every test of its exercise (hidden ones included) and full marks on
every other test. An Adam step that is right but allocates parameter-sized temporaries loses the
memory test only.
"""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ag import course

REPO = Path(__file__).resolve().parents[1]
EXERCISES = {e.number: e for e in course.EXERCISES}
TIMEOUT = 20  # the grader's --timeout: ex1's lecture chain needs 1-2 s of it on an idle machine, 10 on a busy one

RETURN_FIRST = '''
def merge_softmax_blocks(a, b):
    """Returns the first block: right whenever b is empty."""
    return a
'''

BRUTE_FORCE = '''
def _optimal(p, budget):
    """Every plan, tried in turn: exact, and fine up to n = 10."""
    import itertools
    from ag.remat import predict
    best = None
    for r in range(p.n + 1):
        for kept in itertools.combinations(range(p.n), r):
            cost = predict(p, kept)
            if cost.peak_bytes <= budget and (best is None or cost.recompute_flops < best[0]):
                best = (cost.recompute_flops, list(kept))
    if best is None:
        raise ValueError("plan: no checkpoint plan fits")
    return best[1]
'''

NAIVE_FORWARD = """
def tiled_forward(tiles, q, k, v, out=None):
    \"\"\"Naive attention, the public reference's: the whole score matrix at once.\"\"\"
    o, lse = attention(q, k, v, tiles.causal)
    if out:
        out[0][...], out[1][...] = o, lse
        return out
    return o, lse
"""

VISIBLE_KEYS_FORWARD = """
def tiled_forward(tiles, q, k, v, out=None):
    \"\"\"Naive attention over only the keys some query can see: the whole score matrix of those.\"\"\"
    stop = tiles.key_tiles(0, tiles.heads.n_q).stop
    o, lse = attention(q, k[..., :stop, :], v[..., :stop, :], tiles.causal)
    if out:
        out[0][...], out[1][...] = o, lse
        return out
    return o, lse
"""

WHOLE_ROWS_FORWARD = """
def tiled_forward(tiles, q, k, v, out=None):
    \"\"\"A loop over query tiles, each holding its whole row of scores over the keys it sees: no
    online softmax.\"\"\"
    o, lse = np.zeros(q.shape), np.full(q.shape[:-1], -np.inf)
    for q_start in range(0, tiles.heads.n_q, tiles.block_q):
        rows = slice(q_start, q_start + tiles.block_q)
        stop = tiles.key_tiles(q_start, min(q_start + tiles.block_q, tiles.heads.n_q)).stop
        causal = "bottom_right" if tiles.causal else False  # this tile's rows end where their keys do
        o[..., rows, :], lse[..., rows] = attention(q[..., rows, :], k[..., :stop, :], v[..., :stop, :], causal)
    if out:
        out[0][...], out[1][...] = o, lse
        return out
    return o, lse
"""

ZERO_KEYS_FORWARD = """
def tiled_forward(tiles, q, k, v, out=None):
    \"\"\"Naive attention; where keys and values are 0 (a long run that every row sees adds e^0 to
    each row's sum and nothing to O), they are counted instead of held: the other keys' scores only.\"\"\"
    zero = ~(k[0, 0].any(axis=-1) | v[0, 0].any(axis=-1))
    if zero.sum() < 2:
        o, lse = attention(q, k, v, tiles.causal)
    else:
        at, n_q, n_k = np.flatnonzero(~zero), q.shape[-2], k.shape[-2]
        s = q @ np.swapaxes(k[..., at, :], -1, -2) / np.sqrt(q.shape[-1])
        s = np.where(at[None, :] <= np.arange(n_q)[:, None] + n_k - n_q, s, -np.inf)
        m = np.maximum(s.max(axis=-1, keepdims=True), 0)
        e = np.exp(s - m)
        l = e.sum(axis=-1, keepdims=True) + zero.sum() * np.exp(-m)
        o, lse = (e @ v[..., at, :]) / l, (m + np.log(l))[..., 0]
    if out:
        out[0][...], out[1][...] = o, lse
        return out
    return o, lse
"""

NAIVE_BACKWARD = """
def tiled_backward(tiles, q, k, v, o, lse, do, grads=None):
    \"\"\"Naive attention's gradients, the public reference's: P whole.\"\"\"
    return attention_grads(q, k, v, do, tiles.causal)
"""


ALLOCATING_ADAM = '''
def adam_update(theta, g, m, v, t, lr, beta1, beta2, eps, scratch):
    """Adam's rule as written: right, but each line makes temporaries the size of theta."""
    m[...] = beta1 * m + (1 - beta1) * g
    v[...] = beta2 * v + (1 - beta2) * g * g
    theta -= lr * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) * m / (np.sqrt(v) + eps * np.sqrt(1 - beta2 ** t))
'''


def from_the_references(*names: str) -> str:
    """The public references' functions ``names`` and those they call, as their source text."""
    text = (REPO / "tests" / "grading" / "references" / "__init__.py").read_text()
    functions = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
    wanted, todo = set(), list(names)
    while todo:
        name = todo.pop()
        wanted.add(name)
        todo += [n.id for n in ast.walk(functions[name]) if isinstance(n, ast.Name) and n.id in functions
                 and n.id not in wanted]
    return "".join("\n\n" + ast.get_source_segment(text, functions[n]) + "\n" for n in sorted(wanted))


FAKE_LECTURE_TABLE = '''
import ag.demo as _demo
from ag import trace as _trace


class _Snapshot:
    def __init__(self, mb):
        self.allocated_mb = mb


class _Run:
    forward = [_Snapshot(mb) for mb in (32, 65, 98, 131, 163)]
    backward = [_Snapshot(mb) for mb in (196, 171, 147, 122, 97, 40)]


_demo.matmul_chain = lambda *args, **kwargs: _Run()
_trace.snapshot_trace = lambda *args, **kwargs: _Snapshot(40)
'''

FAKE_COUNT = '''
import contextlib as _contextlib

import ag as _ag


class _Counts:
    matmuls = {"forward": 10, "recompute": 21, "backward": 19}


@_contextlib.contextmanager
def _count_ops(*args, **kwargs):
    yield _Counts()


_ag.count_ops = _count_ops
'''

# exercise, the functions replaced in its stub, code appended after them
ATTACKS = {
    "return_the_first_block": (3, RETURN_FIRST, ""),
    "brute_force_search": (6, BRUTE_FORCE, ""),
    "naive_forward_from_the_references": (4, NAIVE_FORWARD + from_the_references("attention"), ""),
    "naive_backward_from_the_references": (5, NAIVE_BACKWARD + from_the_references("attention_grads"), ""),
    "naive_forward_over_the_visible_keys": (4, VISIBLE_KEYS_FORWARD + from_the_references("attention"), ""),
    "whole_rows_of_each_query_tile": (4, WHOLE_ROWS_FORWARD + from_the_references("attention"), ""),
    "zero_keys_counted_not_held": (4, ZERO_KEYS_FORWARD + from_the_references("attention"), ""),
    "faked_lecture_table": (1, "", FAKE_LECTURE_TABLE),
    "faked_recompute_count": (2, "", FAKE_COUNT),
}


def with_functions(source: str, code: str) -> str:
    """``source`` with each top-level function that ``code`` defines replaced by ``code``'s, the
    others (helpers it adds) put before the main block."""
    new = {n.name: n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)}
    lines, code_lines = source.splitlines(keepends=True), code.splitlines(keepends=True)
    chunk = lambda n, text: "".join(text[n.lineno - 1:n.end_lineno]) + "\n"  # noqa: E731
    replaced = set()
    for node in sorted(ast.parse(source).body, key=lambda n: n.lineno, reverse=True):
        if isinstance(node, ast.FunctionDef) and node.name in new:
            lines[node.lineno - 1:node.end_lineno] = [chunk(new[node.name], code_lines)]
            replaced.add(node.name)
    helpers = "".join("\n\n" + chunk(n, code_lines) for name, n in new.items() if name not in replaced)
    text = "".join(lines)
    main = text.index('if __name__ == "__main__":')
    return text[:main] + helpers.lstrip("\n") + "\n\n" + text[main:]


def hostile_file(number: int, code: str, appended: str) -> str:
    stub = (REPO / "exercises" / EXERCISES[number].filename).read_text()
    text = with_functions(stub, code) if code else stub
    main = text.index('if __name__ == "__main__":')
    return text[:main] + appended.lstrip("\n") + ("\n\n" if appended else "") + text[main:]


def graded(submission: Path, out: Path) -> list[dict]:
    result = subprocess.run([sys.executable, "-m", "ag", "grade", str(submission), "--json", str(out),
                             "--timeout", str(TIMEOUT)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.exists(), f"no results.json (exit {result.returncode}): {result.stderr[-2000:]}"
    return json.loads(out.read_text())["tests"]


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_submission_that_skips_the_work_scores_zero_on_its_exercise_and_full_marks_elsewhere(attack, tmp_path):
    number, code, appended = ATTACKS[attack]
    submission = tmp_path / "submission"
    shutil.copytree(REPO / "solutions", submission)
    (submission / EXERCISES[number].filename).write_text(hostile_file(number, code, appended))
    tests = graded(submission, tmp_path / "results.json")
    mine = [t for t in tests if t["name"].startswith(EXERCISES[number].module_name + ":")]
    assert len(mine) >= 3, f"exercise {number} has only {len(mine)} graded tests: {[t['name'] for t in mine]}"
    earned = [f"{t['name']}: {t['score']}" for t in mine if t["score"] != 0 or t["status"] != "failed"]
    assert not earned, f"{attack} earned points on exercise {number}: {earned}"
    lost = [f"{t['name']}: {t['score']}/{t['max_score']} {t['output'][:300]}" for t in tests
            if t not in mine and t["score"] != t["max_score"]]
    assert not lost, f"{attack} cost points outside exercise {number}: {lost}"


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_lazy_file_is_the_stub_with_only_the_attack_changed(attack):
    number, code, appended = ATTACKS[attack]
    text = hostile_file(number, code, appended)
    compile(text, EXERCISES[number].filename, "exec")
    stub = (REPO / "exercises" / EXERCISES[number].filename).read_text()
    solution = (REPO / "solutions" / EXERCISES[number].filename).read_text()
    stub_names = {n.name for n in ast.parse(stub).body if isinstance(n, ast.FunctionDef)}
    kept = [n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name in stub_names
            and ast.get_source_segment(text, n) == ast.get_source_segment(solution, n)
            and ast.get_source_segment(stub, n) != ast.get_source_segment(solution, n)]
    assert not kept, f"{attack} carries the solution of {kept}"


def test_an_adam_step_right_but_with_parameter_sized_temporaries_fails_only_the_memory_test(tmp_path):
    submission = tmp_path / "submission"
    shutil.copytree(REPO / "solutions", submission)
    (submission / EXERCISES[8].filename).write_text(hostile_file(8, ALLOCATING_ADAM, ""))
    tests = graded(submission, tmp_path / "results.json")
    mine = {t["name"].split(": ")[1]: t for t in tests if t["name"].startswith(EXERCISES[8].module_name + ":")}
    memory = mine.pop("test_a_step_allocates_nothing_the_size_of_a_parameter")
    assert memory["score"] == 0 and "MemoryError" in memory["output"], memory
    assert mine and all(t["score"] == t["max_score"] for t in mine.values()), mine
