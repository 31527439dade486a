"""ag.count_ops counts matrix products by phase."""
import numpy as np

import ag


def test_a_matmul_chain_costs_one_product_forward_and_two_backward_per_layer(rng):
    x = ag.Tensor(rng.standard_normal((8, 4)), requires_grad=True)
    weights = [ag.Tensor(rng.standard_normal((4, 4)), requires_grad=True) for _ in range(10)]
    with ag.count_ops() as counts:
        h = x
        for w in weights:
            h = h @ w
        ag.sum(h).backward()
    assert counts.matmuls == {"forward": 10, "backward": 20}
    assert counts.flops["forward"] == 10 * 2 * 8 * 4 * 4
    assert counts.total_matmuls == 30


def test_backward_skips_the_product_for_an_input_that_needs_no_grad(rng):
    x = ag.Tensor(rng.standard_normal((8, 4)))
    w = ag.Tensor(rng.standard_normal((4, 4)), requires_grad=True)
    with ag.count_ops() as counts:
        ag.sum(x @ w).backward()
    assert counts.matmuls == {"forward": 1, "backward": 1}


def test_products_inside_a_rematerializer_count_as_recompute(rng):
    w = ag.Tensor(rng.standard_normal((4, 4)), requires_grad=True)
    x = rng.standard_normal((2, 4))
    with ag.count_ops() as counts:
        h = ag.matmul(x, w)
        h.rematerializer = lambda: ag.matmul(x, w.value)
        (ag.sum(h * h)).backward()  # mul's backward reads h, discarded after mul ran
    assert counts.matmuls == {"forward": 1, "recompute": 1, "backward": 1}
    np.testing.assert_allclose(w.grad, x.T @ (2 * (x @ w.value)))


def test_nested_counters_each_see_their_own_block(rng):
    w = ag.Tensor(rng.standard_normal((3, 3)))
    with ag.count_ops() as outer:
        with ag.count_ops() as inner:
            w @ w
        w @ w
    assert inner.total_matmuls == 1 and outer.total_matmuls == 2
