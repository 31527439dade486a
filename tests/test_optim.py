"""ag.optim: SGD with momentum, Adam and AdamW step for step with torch.optim, in place, their
state allocated at the first step and measured with tracemalloc, saved and resumed exactly."""
import tracemalloc

import numpy as np
import pytest

import ag
import ag.optim as optim

SHAPES = [(64, 48), (48,), (48, 96), (96,), (96, 16)]  # a small MLP's weights and biases

# optimizer, its torch name and hyper-parameters: each rule with and without its weight decay
CONFIGS = {
    "sgd": (optim.SGD, "SGD", dict(lr=0.05)),
    "sgd-momentum": (optim.SGD, "SGD", dict(lr=0.05, momentum=0.9)),
    "sgd-momentum-decay": (optim.SGD, "SGD", dict(lr=0.05, momentum=0.9, weight_decay=1e-2)),
    "adam": (optim.Adam, "Adam", dict(lr=1e-2)),
    "adam-decay": (optim.Adam, "Adam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=1e-2)),
    "adamw": (optim.AdamW, "AdamW", dict(lr=1e-2)),
    "adamw-decay": (optim.AdamW, "AdamW", dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1)),
}
STATE_ARRAYS = {"sgd": 0, "sgd-momentum": 1, "sgd-momentum-decay": 1, "adam": 2, "adam-decay": 2,
                "adamw": 2, "adamw-decay": 2}
DTYPES = [np.float32, np.float64]


def make_params(dtype=np.float64, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [ag.Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True, name=f"p{i}")
            for i, shape in enumerate(shapes)]


def set_random_grads(params, rng):
    for p in params:
        p.grad = rng.standard_normal(p.shape).astype(p.dtype)


def numpy_bytes() -> int:
    """The bytes of NumPy array buffers alive now (NumPy files them under its own tracemalloc domain)."""
    domain = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)
    return sum(t.size for t in tracemalloc.take_snapshot().filter_traces([domain]).traces)


@pytest.fixture
def traced():
    tracemalloc.start()
    yield
    tracemalloc.stop()


# ---- bad input ----

def test_a_parameter_that_is_not_a_leaf_is_refused():
    w = ag.Tensor(np.ones((2, 2)), requires_grad=True, name="w")
    with pytest.raises(ValueError, match=r"params\[1\] \(output of mul\) is not a leaf.*expected a leaf"):
        optim.SGD([w, w * 2.0], lr=0.1)


def test_a_parameter_that_does_not_require_grad_is_refused():
    frozen = ag.Tensor(np.ones(3), name="frozen")
    with pytest.raises(ValueError, match=r"params\[0\] \(tensor 'frozen'\) does not require grad.*requires_grad=True"):
        optim.Adam([frozen])


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_integer_and_bool_parameters_are_refused_naming_their_dtype(dtype):
    with pytest.raises(TypeError, match=rf"has dtype {np.dtype(dtype)}; expected float32 or float64"):
        optim.Adam([ag.Tensor(np.ones(3, dtype))])


def test_float16_parameters_are_refused_pointing_to_float32_master_weights():
    half = ag.Tensor(np.ones(3, np.float16), requires_grad=True)
    with pytest.raises(TypeError, match=r"dtype float16; expected float32 or float64.*float32 master weights"):
        optim.AdamW([half])


def test_something_that_is_not_a_tensor_is_refused():
    with pytest.raises(TypeError, match=r"params\[0\] is a ndarray, expected an ag.Tensor"):
        optim.SGD([np.ones(3)], lr=0.1)
    with pytest.raises(TypeError, match="got a single Tensor: pass \\[tensor\\]"):
        optim.SGD(make_params()[0], lr=0.1)


@pytest.mark.parametrize("params", [[], iter([])], ids=["list", "generator"])
def test_an_empty_parameter_list_is_refused(params):
    with pytest.raises(ValueError, match="empty parameter list; expected at least one Tensor"):
        optim.Adam(params)


def test_a_parameter_given_twice_is_refused():
    a, b = make_params()[:2]
    with pytest.raises(ValueError, match=r"params\[2\] \(tensor 'p0'\) is params\[0\] again"):
        optim.SGD([a, b, a], lr=0.1)


@pytest.mark.parametrize("make", [lambda p: optim.SGD(p, lr=-0.1), lambda p: optim.Adam(p, lr=-1e-3),
                                  lambda p: optim.AdamW(p, lr=float("nan")), lambda p: optim.SGD(p, lr="0.1")],
                         ids=["sgd", "adam", "adamw-nan", "sgd-string"])
def test_a_learning_rate_below_zero_or_not_a_number_is_refused(make):
    with pytest.raises(ValueError, match="lr must be a number >= 0, got"):
        make(make_params())


@pytest.mark.parametrize("betas, message", [((1.0, 0.999), r"betas\[0\] must be in \[0, 1\), got 1.0"),
                                            ((0.9, 1.0), r"betas\[1\] must be in \[0, 1\), got 1.0"),
                                            ((-0.1, 0.999), r"betas\[0\] must be in \[0, 1\), got -0.1"),
                                            ((0.9, float("nan")), r"betas\[1\] must be in \[0, 1\), got nan"),
                                            ((0.9,), r"betas must be a pair")])
def test_betas_outside_zero_to_one_are_refused(betas, message):
    with pytest.raises(ValueError, match=message):
        optim.Adam(make_params(), betas=betas)


@pytest.mark.parametrize("eps", [0.0, -1e-8])
def test_eps_of_zero_or_below_is_refused(eps):
    with pytest.raises(ValueError, match=r"AdamW: eps must be a number > 0, got"):
        optim.AdamW(make_params(), eps=eps)


def test_negative_momentum_and_weight_decay_are_refused():
    with pytest.raises(ValueError, match="SGD: momentum must be a number >= 0, got -0.9"):
        optim.SGD(make_params(), lr=0.1, momentum=-0.9)
    with pytest.raises(ValueError, match="Adam: weight_decay must be a number >= 0, got -0.01"):
        optim.Adam(make_params(), weight_decay=-0.01)


def test_defaults_are_torchs_adamw_decaying_by_default_and_adam_not():
    hyper = lambda opt: {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    assert hyper(optim.Adam(make_params())) == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    assert hyper(optim.AdamW(make_params())) == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}
    assert hyper(optim.SGD(make_params(), lr=0.1)) == {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}


# ---- the update rules, from the papers' formulas ----

def test_adams_first_step_moves_each_parameter_by_lr_against_the_sign_of_its_grad():
    """At t = 1, m̂ = g and v̂ = g², so Δθ = −α g / (|g| + ε) (Kingma & Ba 2015, section 2.1)."""
    params = make_params()
    start = [p.value.copy() for p in params]
    set_random_grads(params, np.random.default_rng(1))
    optim.Adam(params, lr=0.01, eps=1e-8).step()
    for p, theta in zip(params, start):
        np.testing.assert_allclose(p.value, theta - 0.01 * p.grad / (np.abs(p.grad) + 1e-8), rtol=1e-13, atol=1e-15)


def test_sgd_with_momentum_and_weight_decay_follows_torchs_formula_for_two_steps():
    (w,) = make_params(shapes=[(5, 3)])
    theta0 = w.value.copy()
    g1, g2 = np.random.default_rng(1).standard_normal((2, 5, 3))
    opt = optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=0.01)
    w.grad = g1
    opt.step()
    b1 = g1 + 0.01 * theta0
    np.testing.assert_allclose(w.value, theta0 - 0.1 * b1, rtol=1e-14, atol=1e-15)
    theta1 = w.value.copy()
    w.grad = g2
    opt.step()
    np.testing.assert_allclose(w.value, theta1 - 0.1 * (0.9 * b1 + g2 + 0.01 * theta1), rtol=1e-14, atol=1e-15)


def test_adamw_with_a_zero_gradient_only_decays_the_weights_by_lr_times_weight_decay():
    params = make_params()
    start = [p.value.copy() for p in params]
    for p in params:
        p.grad = np.zeros(p.shape)
    optim.AdamW(params, lr=0.01, weight_decay=0.1).step()
    for p, theta in zip(params, start):
        np.testing.assert_array_equal(p.value, theta * (1 - 0.01 * 0.1))


def test_adam_with_a_zero_gradient_still_moves_by_its_weight_decay_in_the_gradient():
    (w,) = make_params(shapes=[(4, 4)])
    start = w.value.copy()
    w.grad = np.zeros(w.shape)
    optim.Adam([w], lr=0.01, weight_decay=0.1).step()
    np.testing.assert_allclose(w.value, start - 0.01 * np.sign(start), rtol=1e-6)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_step_changes_each_value_in_place_and_leaves_the_grads_as_they_were(config):
    make, _, hyper = CONFIGS[config]
    params = make_params()
    set_random_grads(params, np.random.default_rng(1))
    arrays, values, grads = [p.value for p in params], [p.value.copy() for p in params], [p.grad.copy() for p in params]
    make(params, **hyper).step()
    for p, array, value, grad in zip(params, arrays, values, grads):
        assert p.value is array and not np.array_equal(p.value, value)
        np.testing.assert_array_equal(p.grad, grad)


def test_a_parameter_without_a_grad_is_neither_stepped_nor_given_state():
    a, b = make_params()[:2]
    start = b.value.copy()
    opt = optim.Adam([a, b])
    a.grad = np.ones(a.shape)
    opt.step()
    np.testing.assert_array_equal(b.value, start)
    assert list(opt.state_dict()["state"]) == [0] and opt.state_bytes() == 2 * a.nbytes


def test_a_grad_of_another_shape_than_its_parameter_is_refused_at_the_step():
    (w,) = make_params(shapes=[(4, 3)])
    w.grad = np.ones(3)
    with pytest.raises(ValueError, match=r"tensor 'p0' has shape \(4, 3\) and a grad of shape \(3,\)"):
        optim.SGD([w], lr=0.1).step()


def test_a_learning_rate_changed_in_param_groups_between_steps_is_used():
    params = make_params()
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    set_random_grads(params, np.random.default_rng(1))
    opt.step()
    opt.param_groups[0]["lr"] = 0.0
    values = [p.value.copy() for p in params]
    opt.step()
    for p, value in zip(params, values):
        np.testing.assert_array_equal(p.value, value)


# ---- memory: state at the first step, one temporary, grads freed ----

@pytest.mark.parametrize("config", CONFIGS)
def test_state_is_allocated_at_the_first_step_and_holds_one_or_two_times_the_parameters_bytes(config, traced):
    make, _, hyper = CONFIGS[config]
    params = make_params(np.float32)
    set_random_grads(params, np.random.default_rng(1))
    before = numpy_bytes()
    opt = make(params, **hyper)
    assert numpy_bytes() == before and opt.state_dict()["state"] == {} and opt.state_bytes() == 0
    opt.step()
    expected = STATE_ARRAYS[config] * sum(p.nbytes for p in params)
    assert numpy_bytes() - before == expected == opt.state_bytes()


@pytest.mark.parametrize("config", ["sgd-momentum", "adam"])
def test_each_state_array_is_named_after_its_parameter_and_its_role(config):
    make, _, hyper = CONFIGS[config]
    params = make_params()
    opt = make(params, **hyper)
    set_random_grads(params, np.random.default_rng(1))
    opt.step()
    names = [(p.name, name, array.shape == p.shape) for p, name, array in opt.named_state()]
    roles = ["momentum_buffer"] if config == "sgd-momentum" else ["exp_avg", "exp_avg_sq"]
    assert names == [(p.name, role, True) for p in params for role in roles]
    assert all(opt.state[p][role] is array for p, role, array in opt.named_state())


# a step's own Python objects (floats, frames); a parameter here is >= 12 kB
STEP_OVERHEAD = 4096


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS)
def test_a_step_allocates_no_temporary_larger_than_one_parameter(config, dtype, traced):
    make, _, hyper = CONFIGS[config]
    params = make_params(dtype, shapes=[(64, 48), (48, 96), (96, 32)])
    opt = make(params, **hyper)
    rng = np.random.default_rng(1)
    set_random_grads(params, rng)
    opt.step()  # the first step allocates the state
    set_random_grads(params, rng)
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    opt.step()
    after, peak = tracemalloc.get_traced_memory()
    assert peak - before <= max(p.nbytes for p in params) + STEP_OVERHEAD
    assert after - before <= STEP_OVERHEAD  # and it keeps none of it


@pytest.mark.parametrize("config", ["sgd-momentum-decay", "adam-decay", "adamw-decay"])
def test_memory_order_leaves_every_bit_of_the_result_alone(config):
    """Each update is elementwise and every operation in it rounds correctly, so a Fortran-ordered
    parameter steps to the same bits as a C-ordered one."""
    make, _, hyper = CONFIGS[config]
    runs = []
    for order in ("C", "F"):
        (p,) = make_params(np.float32, shapes=[(256, 192)])
        p.value = np.asarray(p.value, order=order)
        opt = make([p], **hyper)
        for g in grads_for([p], 3):
            p.grad = np.asarray(g[0], order=order)
            opt.step()
        runs.append(p.value)
    assert not runs[1].flags.c_contiguous
    np.testing.assert_array_equal(runs[0], runs[1])


def test_zero_grad_frees_every_grad(traced):
    params = make_params()
    opt = optim.SGD(params, lr=0.1)
    set_random_grads(params, np.random.default_rng(1))
    before = numpy_bytes()
    opt.zero_grad()
    assert before - numpy_bytes() == sum(p.nbytes for p in params)
    assert all(p.grad is None for p in params)


def test_zero_grad_without_set_to_none_fills_the_same_buffers_with_zeros(traced):
    params = make_params()
    opt = optim.SGD(params, lr=0.1)
    set_random_grads(params, np.random.default_rng(1))
    buffers = [p.grad for p in params]
    before = numpy_bytes()
    opt.zero_grad(set_to_none=False)
    assert numpy_bytes() == before
    assert all(p.grad is buffer and not buffer.any() for p, buffer in zip(params, buffers))


# ---- state dict: saved with np.savez, resumed exactly ----

def run_steps(opt, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.copy()
        opt.step()


def grads_for(params, steps, seed=1):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(p.shape).astype(p.dtype) for p in params] for _ in range(steps)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS)
def test_fifty_steps_saved_loaded_and_fifty_more_equal_a_hundred_straight_bit_for_bit(config, dtype, tmp_path):
    make, _, hyper = CONFIGS[config]
    straight = make_params(dtype)
    grads = grads_for(straight, 100)
    run_steps(make(straight, **hyper), straight, grads)

    first = make_params(dtype)
    opt = make(first, **hyper)
    run_steps(opt, first, grads[:50])
    np.savez(tmp_path / "optimizer.npz", **optim.state_dict_to_arrays(opt.state_dict()))
    np.savez(tmp_path / "model.npz", *[p.value for p in first])
    with np.load(tmp_path / "model.npz") as model:
        resumed = [ag.Tensor(model[f"arr_{i}"], requires_grad=True) for i in range(len(first))]
    fresh = make(resumed, **hyper)
    with np.load(tmp_path / "optimizer.npz") as saved:  # allow_pickle=False: plain arrays only
        fresh.load_state_dict(optim.state_dict_from_arrays(saved))
    run_steps(fresh, resumed, grads[50:])
    for a, b in zip(straight, resumed):
        np.testing.assert_array_equal(a.value, b.value)


def test_the_state_dict_is_torchs_layout_with_parameters_by_index():
    params = make_params()
    opt = optim.Adam(params, lr=0.01)
    assert opt.state_dict() == {"state": {}, "param_groups": [
        {"params": [0, 1, 2, 3, 4], "lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}]}
    params[3].grad = np.ones(params[3].shape)
    opt.step()
    state = opt.state_dict()["state"]
    assert list(state) == [3] and state[3]["step"] == 1 and sorted(state[3]) == ["exp_avg", "exp_avg_sq", "step"]


def test_load_state_dict_takes_the_saved_hyper_parameters_and_copies_the_arrays():
    params = make_params()
    opt = optim.SGD(params, lr=0.5, momentum=0.9)
    set_random_grads(params, np.random.default_rng(1))
    opt.step()
    saved = opt.state_dict()
    fresh = optim.SGD(params, lr=0.1, momentum=0.5)
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == 0.5 and fresh.param_groups[0]["momentum"] == 0.9
    buffer = fresh.state[params[0]]["momentum_buffer"]
    assert buffer is not saved["state"][0]["momentum_buffer"]
    np.testing.assert_array_equal(buffer, saved["state"][0]["momentum_buffer"])


def test_load_state_dict_refuses_state_for_other_parameters():
    params = make_params()
    opt = optim.Adam(params)
    set_random_grads(params, np.random.default_rng(1))
    opt.step()
    saved = opt.state_dict()
    with pytest.raises(ValueError, match=r"saved group has 5 parameters, this optimizer 2"):
        optim.Adam(params[:2]).load_state_dict(saved)
    other = make_params(shapes=[(3, 3)] * 5)
    mismatch = r"state 0 exp_avg is \(64, 48\) float64, expected \(3, 3\) float64 like params\[0\]"
    with pytest.raises(ValueError, match=mismatch):
        optim.Adam(other).load_state_dict(saved)
    with pytest.raises(ValueError, match=r"one param group with keys \['lr', 'momentum', 'params', 'weight_decay'\]"):
        optim.SGD(params, lr=0.1).load_state_dict(saved)


def test_a_state_file_with_an_unknown_array_name_is_refused():
    arrays = {"state.0.step": np.asarray(1), "weights": np.ones(3)}
    with pytest.raises(ValueError, match="array 'weights' is not named 'state.<index>.<name>'"):
        optim.state_dict_from_arrays(arrays)


# ---- against torch.optim, step for step ----

def rounding_tolerance(params, steps):
    """Each step rounds θ − γ·u once in torch (a fused multiply-add) and twice in NumPy, and the
    update u itself a few times in a different order (torch's lerp for m, addcdiv): the two runs
    part by about an ulp of θ a step, so after ``steps`` steps by at most ``steps`` units of
    eps·max|θ|: 5e-5 for float32 here, 1e-13 for float64 (the runs part by 1/100 of that)."""
    return steps * np.finfo(params[0].dtype).eps * max(np.abs(p.value).max() for p in params)


def torch_twin(torch, params, name, hyper):
    twins = [torch.tensor(p.value.copy(), requires_grad=True) for p in params]
    return twins, getattr(torch.optim, name)(twins, **hyper)


def steps_beside_torch(torch, config, params, steps):
    """``steps`` steps of ag's optimizer and torch's on the same random grads; torch's parameters."""
    make, name, hyper = CONFIGS[config]
    twins, torch_opt = torch_twin(torch, params, name, hyper)
    opt = make(params, **hyper)
    for step_grads in grads_for(params, steps):
        for p, twin, g in zip(params, twins, step_grads):
            p.grad, twin.grad = g, torch.from_numpy(g.copy())
        opt.step()
        torch_opt.step()
    return twins


def assert_same_params(params, twins, steps):
    tolerance = rounding_tolerance(params, steps)
    for p, twin in zip(params, twins):
        np.testing.assert_allclose(p.value, twin.detach().numpy(), rtol=0, atol=tolerance,
                                   err_msg=f"{p.name} after {steps} steps")


@pytest.mark.oracle
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS)
def test_a_hundred_steps_on_the_same_random_grads_match_torch_optim(config, dtype, torch_or_skip):
    params = make_params(dtype)
    assert_same_params(params, steps_beside_torch(torch_or_skip, config, params, 100), 100)


def ag_mlp_loss(params, x, y):
    h = ag.Tensor(x)
    for i in range(0, len(params), 2):
        h = ag.linear(h, params[i], params[i + 1])
        h = ag.tanh(h) if i + 2 < len(params) else h
    return ag.mean((h - ag.Tensor(y)) ** 2)


def torch_mlp_loss(torch, params, x, y):
    h = torch.from_numpy(x)
    for i in range(0, len(params), 2):
        h = h @ params[i] + params[i + 1]
        h = torch.tanh(h) if i + 2 < len(params) else h
    return torch.mean((h - torch.from_numpy(y)) ** 2)


# lr 3e-3 for Adam: at 1e-2 with L2 decay a weight whose data gradient vanishes swings about zero
# in steps of ±lr, where Adam's g/√v turns on the rounding, and both runs part by 50x the bound
# above in float32 and in float64 alike: the dynamics amplify rounding there, the rule is the same
MLP_CONFIGS = {"sgd-momentum-decay": dict(lr=0.05, momentum=0.9, weight_decay=1e-2),
               "adam-decay": dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=1e-2),
               "adamw-decay": dict(lr=3e-3, betas=(0.8, 0.99), weight_decay=0.1)}


@pytest.mark.oracle
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", MLP_CONFIGS)
def test_a_hundred_steps_training_the_same_mlp_match_torch_optim(config, dtype, torch_or_skip):
    """Real grads: ag's tanh MLP and the same MLP in torch, from the same weights, each framework's
    backward feeding its own optimizer; their grads differ by the products' rounding only (tanh,
    unlike relu, has no kink where that rounding could flip a unit on or off)."""
    torch = torch_or_skip
    make, name, hyper = CONFIGS[config][0], CONFIGS[config][1], MLP_CONFIGS[config]
    rng = np.random.default_rng(2)
    params = make_params(dtype, seed=3, shapes=[(16, 32), (32,), (32, 32), (32,), (32, 4), (4,)])
    for p in params:
        p.value *= 1 / np.sqrt(p.shape[0]) if p.ndim == 2 else 0.1
    x, y = rng.standard_normal((64, 16)).astype(dtype), rng.standard_normal((64, 4)).astype(dtype)
    twins, torch_opt = torch_twin(torch, params, name, hyper)
    opt = make(params, **hyper)
    losses = []
    for _ in range(100):
        opt.zero_grad()
        torch_opt.zero_grad()
        loss, twin_loss = ag_mlp_loss(params, x, y), torch_mlp_loss(torch, twins, x, y)
        loss.backward()
        twin_loss.backward()
        opt.step()
        torch_opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]  # it trains
    assert_same_params(params, twins, 100)


# ---- a step in blocks: the same bits, a temporary of one block ----

LARGE = [(300, 257), (257,)]  # 77,100 values: two whole blocks of 2^15 and a ragged third


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("config", CONFIGS)
def test_a_step_in_blocks_gives_the_bits_of_one_pass_over_the_whole_parameter(config, order, monkeypatch):
    make, _, hyper = CONFIGS[config]
    runs = []
    for block in (optim.BLOCK, 10 ** 9):
        monkeypatch.setattr(optim, "BLOCK", block)
        params = make_params(np.float32, shapes=LARGE)
        for p in params:
            p.value = np.asarray(p.value, order=order)
        opt = make(params, **hyper)
        for step_grads in grads_for(params, 3):
            for p, g in zip(params, step_grads):
                p.grad = np.asarray(g, order=order)
            opt.step()
        runs.append([p.value for p in params])
    for blocked, whole in zip(*runs):
        assert np.array_equal(blocked, whole)


@pytest.mark.parametrize("config", ["sgd-momentum", "sgd-momentum-decay", "adamw-decay"])
def test_a_step_over_a_parameter_of_many_blocks_allocates_one_blocks_temporary(config, traced):
    make, _, hyper = CONFIGS[config]
    params = make_params(np.float32, shapes=[(8 * optim.BLOCK,)])
    opt = make(params, **hyper)
    set_random_grads(params, np.random.default_rng(1))
    opt.step()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    opt.step()
    peak = tracemalloc.get_traced_memory()[1] - before
    assert peak <= optim.BLOCK * 4 + STEP_OVERHEAD < params[0].nbytes // 4, peak


@pytest.mark.oracle
@pytest.mark.parametrize("config", CONFIGS)
def test_parameters_of_several_blocks_match_torch_optim(config, torch_or_skip):
    params = make_params(np.float32, shapes=LARGE)
    assert_same_params(params, steps_beside_torch(torch_or_skip, config, params, 10), 10)
