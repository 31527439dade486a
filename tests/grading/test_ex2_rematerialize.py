"""Exercise 2: rematerialize missing values in the backward loop; discard what can be recomputed.

Counting recomputed products alone could be faked (``ag.count_ops`` lives in the student's
process), so the same test runs a chain whose values fit the worker's 3 GiB of address space
(``sandbox.ADDRESS_SPACE``) only if each recomputed value is discarded again, and checks its grad."""
import numpy as np
import pytest
from references import tanh_chain_grads
from zero_pages import sin_head, weighted_head

from ag.course import probe
from ag.course.checks import expect_close, expect_equal


def chain(seed=0):
    """Ten 8 × 8 weights and a 4 × 8 input."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((8, 8)) / 3 for _ in range(10)], rng.standard_normal((4, 8))


@probe
def discard_both(ex):
    """Runs in the worker: discard_value_if_has_rematerializer on a checkpoint and on a recomputable tensor."""
    import ag
    kept, recomputable = ag.Tensor(np.ones(3)), ag.Tensor(np.ones(3), rematerializer=lambda: np.ones(3))
    ex.discard_value_if_has_rematerializer(kept)
    ex.discard_value_if_has_rematerializer(recomputable)
    return {"kept": kept.value, "recomputable": recomputable.value}


@probe
def rematerialized_grads(ex, weights, x, mode):
    """Runs in the worker: the weights' grads of Σ tanh-chain(x), keeping only output 5."""
    import ag
    from ag import remat
    ws = [ag.Tensor(w, requires_grad=True) for w in weights]
    layers = [lambda h, w=w: ag.tanh(h @ w) for w in ws]
    ag.sum(remat.sequential(layers, ag.Tensor(x), [5], mode=mode)).backward()
    return [w.grad for w in ws]


@probe
def recomputed_products(ex, weights, x):
    """Runs in the worker: how many products backward reruns on a linear chain keeping output 5."""
    import ag
    from ag import remat
    ws = [ag.Tensor(w, requires_grad=True) for w in weights]
    layers = [lambda h, w=w: h @ w for w in ws]  # each layer reads only its input in backward
    with ag.count_ops() as counts:
        ag.sum(remat.sequential(layers, ag.Tensor(x), [5], mode="tensor")).backward()
    return counts.matmuls["recompute"]


HEAD_LAYERS, VALUE_MIB = 24, 160  # 25 values of 160 MiB: 3.9 GiB if every one stays, under 2 GiB with sqrt checkpoints


def head_chain_grad(x, w, n_layers):
    """The grad of Σ w · h_n for h_i = sin(h_(i-1)) + 1/2, h_0 = x (4 numbers), in plain NumPy."""
    hs = [np.asarray(x, dtype=np.float64)]
    for _ in range(n_layers):
        hs.append(np.sin(hs[-1]) + 0.5)
    g = np.asarray(w, dtype=np.float64)
    for h in reversed(hs[:-1]):
        g = g * np.cos(h)
    return g


@probe
def discarded_chain(ex, x, w):
    """Runs in the worker: x's grad (first 4 elements) through HEAD_LAYERS sin_head layers of VALUE_MIB
    MiB each, with the sqrt plan's checkpoints, tensor mode."""
    import ag
    from ag import remat
    h = ag.Tensor(np.zeros(VALUE_MIB * 2**20 // 8), requires_grad=True)
    h.value[:4] = x
    out = remat.sequential([sin_head] * HEAD_LAYERS, h, remat.plan(HEAD_LAYERS, "sqrt"), mode="tensor")
    weighted_head(out, w).backward()
    return h.grad[:4].copy()


@pytest.mark.points(3)
def test_a_tensor_with_a_rematerializer_is_discarded_and_one_without_is_kept(worker):
    got = worker(discard_both)
    expect_close(got["kept"], np.ones(3), what="the value of a tensor without a rematerializer")
    expect_equal(got["recomputable"], None, what="the value of a tensor with a rematerializer")


@pytest.mark.points(4)
@pytest.mark.parametrize("mode", ["segment", "tensor"])
def test_gradients_with_rematerialization_equal_those_without(worker, mode):
    weights, x = chain()
    got = worker(rematerialized_grads, weights, x, mode)
    want = tanh_chain_grads(x, weights)
    expect_equal(len(got) if isinstance(got, list) else got, len(want), what="the number of weight grads")
    for i, (g, w) in enumerate(zip(got, want)):
        expect_close(g, w, rtol=1e-10, atol=1e-14, what=f"the grad of W{i} with only output 5 kept ({mode} mode)")


@pytest.mark.points(3)
def test_each_value_is_recomputed_as_often_as_the_lecture_says_and_discarded_again(worker):
    weights, x = chain()
    expect_equal(worker(recomputed_products, weights, x), 21,
                 what="products recomputed in backward (x_i costs i+1 before output 5, i-5 after)")
    x, w = np.array([0.1, -0.7, 1.3, 2.0]), np.array([1.0, -2.0, 0.5, 3.0])
    expect_close(worker(discarded_chain, x, w), head_chain_grad(x, w, HEAD_LAYERS), rtol=1e-12,
                 what=f"x's grad through {HEAD_LAYERS} layers of {VALUE_MIB} MiB, which fit the worker's 3 GiB "
                      "only if each recomputed value is discarded once no step reads it")
