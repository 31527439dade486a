"""Exercise 1: lazy grads and discarding them in backward.

What the lecture's table shows, grads freed as backward goes, is also measured where student code
cannot fake it: a chain whose grads together need more address space than the worker's 3 GiB
(``sandbox.ADDRESS_SPACE``) runs only if each non-leaf grad is freed after its step."""
import numpy as np
import pytest
from zero_pages import scale_head, weighted_head

from ag.course import probe
from ag.course.checks import expect_close, expect_equal, expect_true


@probe
def accumulate_twice(ex, first, second):
    """Runs in the worker: a fresh leaf's grad before, after one and after two accumulate_grad calls."""
    import ag
    t = ag.Tensor(np.zeros(first.shape), requires_grad=True)
    before = t.grad
    ex.accumulate_grad(t, first)
    after_first = t.grad.copy() if isinstance(t.grad, np.ndarray) else t.grad
    ex.accumulate_grad(t, second)
    return {"before": before, "after_first": after_first, "after_second": t.grad}


@probe
def tanh_step(ex, x, w):
    """Runs in the worker: backward of Σ tanh(x W)²; which grads survive it, and W's grad."""
    import ag
    w = ag.Tensor(w, requires_grad=True)
    h1 = ag.matmul(x, w)
    h2 = ag.tanh(h1)
    loss = ag.sum(h2 * h2)
    loss.backward()
    return {"h1": h1.grad, "h2": h2.grad, "loss": loss.grad, "w": w.grad}


CHAIN_BATCH, CHAIN_WIDTH, CHAIN_LAYERS = 4096, 256, 5  # the lecture's chain with weights 256 × 256, not 1000 × 1000


@probe
def lecture_chain(ex, batch, width, layers):
    """Runs in the worker: the lecture's chain x = matmul(x, w) over ``layers`` weights (width × width)
    at ``batch`` rows, traced: MB allocated after each backward step."""
    from ag import demo
    run = demo.matmul_chain(batch, layers, eager=False, width=width)
    return [s.allocated_mb for s in run.backward]


def lecture_rule(batch: int, width: int, layers: int) -> list[int]:
    """MB (10⁶ B) allocated after each backward step of the lecture's chain when each step frees its
    output's grad, and its value once nothing reads it: after the sum, the L outputs and the last
    one's grad, a = batch · width · 8 B each; after matmul step i, one a fewer and i weight grads,
    w = width² · 8 B; after the last (x needs no grad), the L weight grads. At batch 4096 and width
    1000 this is the lecture's table, [196, 171, 147, 122, 97, 40]."""
    a, w = batch * width * 8, width * width * 8
    return [((layers + 1 - i) * a + i * w) // 10**6 for i in range(layers)] + [layers * w // 10**6]


HELD_LAYERS, GRAD_MIB = 14, 256  # 14 grads of 256 MiB: 3.5 GiB if kept, under 1 GiB if freed


@probe
def held_chain(ex, scales, w):
    """Runs in the worker: backward through h_i = scales[i] · h_(i-1) (on the first 4 of GRAD_MIB MiB),
    every h_i held by the caller as a user's list would; x's grad on the first 4, and which h_i
    kept a grad."""
    import ag
    x = ag.Tensor(np.zeros(GRAD_MIB * 2**20 // 8), requires_grad=True)
    hs = [x]
    for c in scales:
        hs.append(scale_head(hs[-1], c))
    weighted_head(hs[-1], w).backward()
    return {"x": x.grad[:4].copy(), "kept": [h.grad is not None for h in hs[1:]]}


@probe
def retained(ex):
    """Runs in the worker: a non-leaf that asked to keep its grad, after backward."""
    import ag
    w = ag.Tensor(np.ones((3, 3)), requires_grad=True)
    h = ag.matmul(np.ones((2, 3)), w).retain_grad()
    ag.sum(h).backward()
    return h.grad


@probe
def reused(ex, a):
    """Runs in the worker: the grad of a tensor used twice (b = a + a), through Σ b²."""
    import ag
    a = ag.Tensor(a, requires_grad=True)
    b = a + a
    ag.sum(b * b).backward()
    return a.grad


@pytest.mark.points(2)
def test_accumulate_grad_allocates_on_first_flow_and_adds_after(worker):
    got = worker(accumulate_twice, np.ones(3), np.full(3, 2.0))
    expect_equal(got["before"], None, what="the grad of a leaf nothing has flowed into yet")
    expect_close(got["after_first"], np.ones(3), what="the grad after the first accumulate_grad")
    expect_close(got["after_second"], np.full(3, 3.0), what="the grad after the second accumulate_grad")


@pytest.mark.points(2)
def test_backward_frees_the_grad_of_every_non_leaf_and_keeps_the_leaves(worker):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 4)), rng.standard_normal((4, 4))
    got = worker(tanh_step, x, w)
    for name in ("h1", "h2", "loss"):
        expect_equal(got[name], None, what=f"the grad of the non-leaf {name} after backward")
    y = np.tanh(x @ w)
    expect_close(got["w"], x.T @ (2 * y * (1 - y * y)), rtol=1e-12, what="the leaf W's grad")


@pytest.mark.points(3)
def test_backward_memory_matches_the_lecture_table_and_frees_each_grad_under_a_memory_limit(worker):
    expect_equal(worker(lecture_chain, CHAIN_BATCH, CHAIN_WIDTH, CHAIN_LAYERS),
                 lecture_rule(CHAIN_BATCH, CHAIN_WIDTH, CHAIN_LAYERS),
                 what=f"MB allocated after each backward step of the lecture's chain at batch {CHAIN_BATCH}, "
                      f"weights {CHAIN_WIDTH} × {CHAIN_WIDTH} (the lecture's table has weights 1000 × 1000)")
    scales, w = [0.5 + 0.1 * i for i in range(HELD_LAYERS)], np.array([1.0, -2.0, 0.5, 3.0])
    got = worker(held_chain, scales, w)
    expect_close(got["x"], np.prod(scales) * w, rtol=1e-12,
                 what=f"x's grad through {HELD_LAYERS} held layers whose grads ({GRAD_MIB} MiB each) fit the "
                      "worker's 3 GiB only if each is freed after its step")
    expect_equal(got["kept"], [False] * HELD_LAYERS, what="which held non-leaf tensors kept a grad after backward")


@pytest.mark.points(2)
def test_a_retained_grad_survives_backward(worker):
    expect_close(worker(retained), np.ones((2, 3)), what="the retained grad of h = x W")


@pytest.mark.points(1)
def test_grads_are_correct_through_a_reused_tensor(worker):
    a = np.array([1.0, 2.0])
    got = worker(reused, a)
    expect_true(got is not None, "**a.grad** is None: both uses of a must flow into it")
    expect_close(got, 8 * a, what="the grad of a through b = a + a, loss = Σ b²")
