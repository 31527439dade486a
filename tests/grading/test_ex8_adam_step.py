"""Exercise 8: Adam's step in place.

The values are checked against Adam's rule written out (references); the memory is measured where
student code cannot fake it: a parameter of PARAM_MIB MiB, with its grad, m, v and scratch, fits what
this exercise's worker may map beyond its own start (``WORKER_HEADROOM``) only if the step allocates
nothing of the parameter's size."""
import numpy as np
import pytest
from references import adam_steps

from ag.course import probe
from ag.course.checks import expect_close, expect_true

PARAM_MIB = 64
# Five parameter-sized arrays (320 MiB) and 48 MiB for the probe's own needs fit; a sixth (384 MiB)
# does not. Small, since every page of four of them is written.
WORKER_HEADROOM = (5 * PARAM_MIB + 48) * 2**20


@probe
def steps(ex, theta, grads, lr, betas, eps, g_in_scratch):
    """Runs in the worker: θ, m, v after the student's adam_update for t = 1, 2, ... (g copied into
    scratch first and passed as both when ``g_in_scratch``, as Adam's L2 weight decay does)."""
    theta = theta.copy()
    m, v, scratch = np.zeros_like(theta), np.zeros_like(theta), np.empty_like(theta)
    for t, grad in enumerate(grads, start=1):
        g = np.copyto(scratch, grad) or scratch if g_in_scratch else grad.copy()
        ex.adam_update(theta, g, m, v, t, lr, betas[0], betas[1], eps, scratch)
    return {"theta": theta, "m": m, "v": v}


@probe
def optimizer(ex, name, theta, grads, lr, weight_decay):
    """Runs in the worker: the parameter after ag.optim's Adam or AdamW (stepping with the student's
    adam_update) on ``grads``, and its state's bytes."""
    import ag
    from ag import optim
    w = ag.Tensor(theta.copy(), requires_grad=True)
    opt = getattr(optim, name)([w], lr=lr, weight_decay=weight_decay)
    for grad in grads:
        w.grad = grad.copy()
        opt.step()
    return {"theta": w.value, "state_bytes": opt.state_bytes()}


@probe
def huge_step(ex, head, grad_head):
    """Runs in the worker: one step on a PARAM_MIB MiB parameter (zero but for its first 4 values);
    those 4 after it."""
    n = PARAM_MIB * 2**20 // 8
    theta, g = np.zeros(n), np.zeros(n)
    theta[:4], g[:4] = head, grad_head
    m, v, scratch = np.zeros(n), np.zeros(n), np.empty(n)
    ex.adam_update(theta, g, m, v, 1, 0.1, 0.9, 0.999, 1e-8, scratch)
    return theta[:4].copy()


def problem(seed, shape=(5, 7), count=6):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), [rng.standard_normal(shape) for _ in range(count)]


@pytest.mark.points(3)
def test_six_steps_follow_adams_rule_for_theta_m_and_v(worker):
    theta, grads = problem(0)
    for lr, betas, eps in ((1e-3, (0.9, 0.999), 1e-8), (0.1, (0.5, 0.9), 1e-3)):
        got = worker(steps, theta, grads, lr, betas, eps, False)
        want = adam_steps(theta, grads, lr, betas, eps)
        for i, name in enumerate(("theta", "m", "v")):
            expect_close(got[name], want[i], rtol=1e-10, atol=1e-14,
                         what=f"{name} after 6 steps (lr={lr}, betas={betas}, eps={eps})")


@pytest.mark.points(2)
def test_a_grad_that_lives_in_scratch_is_read_before_scratch_is_overwritten(worker):
    theta, grads = problem(1)
    got = worker(steps, theta, grads, 0.01, (0.9, 0.999), 1e-8, True)
    want = adam_steps(theta, grads, 0.01)
    expect_close(got["theta"], want[0], rtol=1e-10, atol=1e-14,
                 what="theta after 6 steps where g is the scratch array itself")


@pytest.mark.points(2)
def test_ag_optim_adam_and_adamw_step_with_it_weight_decay_included(worker):
    theta, grads = problem(2, shape=(3, 4), count=5)
    for name, decoupled in (("Adam", False), ("AdamW", True)):
        got = worker(optimizer, name, theta, grads, 0.05, 0.1)
        want = adam_steps(theta, grads, 0.05, weight_decay=0.1, decoupled=decoupled)
        expect_close(got["theta"], want[0], rtol=1e-10, atol=1e-14, what=f"{name}(weight_decay=0.1) after 5 steps")
        expect_true(got["state_bytes"] == 2 * theta.nbytes,
                    f"**{name}'s state** holds m and v, {2 * theta.nbytes} bytes; got {got['state_bytes']}")


@pytest.mark.points(3)
def test_a_step_allocates_nothing_the_size_of_a_parameter(worker):
    head, grad_head = np.array([1.0, -2.0, 0.5, 3.0]), np.array([0.3, -0.1, 2.0, 0.0])
    got = worker(huge_step, head, grad_head)
    want = adam_steps(head, [grad_head], 0.1)[0]
    expect_close(got, want, rtol=1e-12, atol=1e-15,
                 what=f"the first 4 values of a {PARAM_MIB} MiB parameter after one step, which with its grad, "
                      f"m, v and scratch fits the worker's {WORKER_HEADROOM >> 20} MiB only if the step allocates "
                      "nothing of its size")
