"""Backward receives what forward saved: every op's closure reads ``saved[t]`` for the tensors
it declared (``saves=``, ``saves_output=True``), and nothing else."""
import numpy as np
import pytest

import ag
from ag import attention, remat


def _leaves(rng, *shapes, positive=False):
    return [ag.Tensor(np.abs(rng.standard_normal(s)) + 0.5 if positive else rng.standard_normal(s),
                      requires_grad=True) for s in shapes]


OPS = {
    "add": (lambda a, b: a + b, [(3, 4), (4,)]),
    "sub": (lambda a, b: a - b, [(3, 4), (3, 1)]),
    "mul": (lambda a, b: a * b, [(3, 4), (3, 4)]),
    "div": (lambda a, b: a / b, [(3, 4), (4,)]),
    "pow": (lambda a: ag.pow(a, 3.0), [(3, 4)]),
    "neg": (lambda a: -a, [(3, 4)]),
    "matmul": (lambda a, b: a @ b, [(3, 4), (4, 5)]),
    "matmul, vector @ matrix": (lambda a, b: a @ b, [(4,), (4, 5)]),
    "matmul, batched @ vector": (lambda a, b: a @ b, [(2, 3, 4), (4,)]),
    "linear": (lambda x, w, b: ag.linear(x, w, b), [(2, 3, 4), (4, 5), (5,)]),
    "sum": (lambda a: ag.sum(a, axis=1), [(3, 4)]),
    "sum, to one number": (lambda a: ag.sum(a), [(3, 4)]),
    "mean": (lambda a: ag.mean(a, axis=0, keepdims=True), [(3, 4)]),
    "max": (lambda a: ag.max(a, axis=1), [(3, 4)]),
    "logsumexp": (lambda a: ag.logsumexp(a, axis=-1), [(3, 4)]),
    "softmax": (lambda a: ag.softmax(a, axis=-1), [(3, 4)]),
    "log_softmax": (lambda a: ag.log_softmax(a, axis=-1), [(3, 4)]),
    "exp": (ag.exp, [(3, 4)]),
    "log": (ag.log, [(3, 4)]),
    "sqrt": (ag.sqrt, [(3, 4)]),
    "relu": (ag.relu, [(3, 4)]),
    "tanh": (ag.tanh, [(3, 4)]),
    "sigmoid": (ag.sigmoid, [(3, 4)]),
    "gelu": (ag.gelu, [(3, 4)]),
    "layer_norm": (lambda x, g, b: ag.layer_norm(x, g, b), [(3, 4), (4,), (4,)]),
    "dropout": (lambda x: ag.dropout(x, 0.5, np.random.default_rng(1)), [(3, 4)]),
    "scaled_masked_softmax": (lambda s: ag.scaled_masked_softmax(s, 0.5, causal=True), [(2, 4, 4)]),
    "reshape": (lambda a: a.reshape(4, 3), [(3, 4)]),
    "transpose": (lambda a: a.transpose((1, 0)), [(3, 4)]),
    "getitem": (lambda a: a[1:, [0, 2, 2]], [(3, 4)]),
    "concat": (lambda a, b: ag.concat([a, b], axis=1), [(3, 4), (3, 2)]),
    "where": (lambda a, b: ag.where(np.arange(4) % 2 == 0, a, b), [(3, 4), (3, 4)]),
    "flash_attention": (lambda q, k, v: attention.flash_attention(q, k, v, causal=True, block_q=2, block_k=2),
                        [(1, 2, 4, 3), (1, 2, 4, 3), (1, 2, 4, 3)]),
    "checkpoint": (lambda a, b: remat.checkpoint(lambda x, y: ag.tanh(x @ y), a, b), [(3, 4), (4, 2)]),
}


def _grads(fn, shapes, discard_undeclared: bool):
    rng = np.random.default_rng(0)
    leaves = _leaves(rng, *shapes, positive=True)
    out = fn(*leaves)
    if discard_undeclared:
        declared = {id(t) for t in out._saved}
        for t in leaves:
            if id(t) not in declared:
                t.value = None  # any read of it now fails: None has no arithmetic
        if not out._saves_output:
            out.value = None
    dy = np.random.default_rng(1).standard_normal(out.shape)
    out.backward(dy)
    return [t.grad for t in leaves]


@pytest.mark.parametrize("name", sorted(OPS))
def test_an_ops_backward_needs_only_the_values_it_declared(name):
    fn, shapes = OPS[name]
    expected = _grads(fn, shapes, discard_undeclared=False)
    got = _grads(fn, shapes, discard_undeclared=True)
    for e, g in zip(expected, got):
        assert g is not None and np.allclose(e, g), name


def test_the_catalogue_covers_every_op_ag_exports():
    names = {n.split(",")[0] for n in OPS} | {"pow"}
    exported = {n for n in ag.__all__ if (getattr(getattr(ag, n), "__module__", None) or "").startswith("ag.ops.")
                and getattr(ag, n).__module__ != "ag.lab.threads"  # set_workers: a setting, not an op
                and callable(getattr(ag, n)) and not isinstance(getattr(ag, n), type)}
    assert {"add", "matmul", "sum", "gelu", "layer_norm", "where"} <= exported  # the ops live in ag/ops/*.py
    assert exported <= names, exported - names


def _square_reading_an_undeclared_value(a):
    value = a.value ** 2

    def _backward(out, saved):
        ag.accumulate_grad(a, 2 * out.grad * saved[a])  # a is not in saves=
    return ag.make_output(value, "square", (a,), _backward)


def test_reading_a_value_the_forward_did_not_save_fails_loudly_naming_the_op():
    a = ag.Tensor(np.ones(3), requires_grad=True, name="a")
    out = _square_reading_an_undeclared_value(a)
    with pytest.raises(ag.GraphError, match=r"backward of square reads the value of tensor 'a', which "
                                            r"its forward did not save"):
        ag.sum(out).backward()


def test_the_output_is_readable_only_when_saves_output_says_so():
    a = ag.Tensor(np.ones(3), requires_grad=True)

    def _backward(out, saved):
        ag.accumulate_grad(a, out.grad * saved[out])
    out = ag.make_output(np.exp(a.value), "exp_undeclared", (a,), _backward)
    with pytest.raises(ag.GraphError, match="exp_undeclared"):
        out.backward(np.ones(3))


def test_rematerialization_restores_exactly_the_declared_values(rng):
    x = ag.Tensor(rng.standard_normal((4, 5)), requires_grad=True)
    h = ag.tanh(x)  # saves its output
    h.rematerializer = lambda: np.tanh(x.value)
    calls = []
    pre = ag.Tensor(rng.standard_normal((4, 5)), rematerializer=lambda: calls.append("pre") or pre_value)
    pre_value = pre.value.copy()
    y = ag.sum(h + pre)  # add saves nothing: pre's rematerializer must never run
    ag.discard_value_if_has_rematerializer(h)
    y.backward()
    assert calls == [] and np.allclose(x.grad, 1 - np.tanh(x.value) ** 2)


def _backward_closures():
    """Every ``_backward`` closure defined in ag, with where it is."""
    import ast
    from pathlib import Path
    root = Path(ag.__file__).parent
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "_backward":
                yield f"{path.relative_to(root.parent)}:{node.lineno}", node


def test_there_are_backward_closures_to_check():
    assert len(list(_backward_closures())) >= 30


@pytest.mark.parametrize("where,closure", list(_backward_closures()), ids=lambda x: x if isinstance(x, str) else "")
def test_a_backward_closure_reads_values_through_saved_never_value(where, closure):
    import ast
    assert [a.arg for a in closure.args.args] == ["out", "saved"], f"{where}: takes (out, saved)"
    reads = [n.lineno for n in ast.walk(closure) if isinstance(n, ast.Attribute) and n.attr == "value"]
    assert not reads, f"{where}: reads .value on line(s) {reads}; read saved[t] for a declared t"


def test_lecture_2_quotes_ag_mul_as_it_is():
    import inspect
    from pathlib import Path
    note = (Path(__file__).resolve().parent.parent / "lectures" / "02-lazy-and-discarded-grads.md").read_text()
    assert inspect.getsource(ag.ops.mul) in note
