"""ag.amp: 16-bit compute with float32 master weights, dynamic loss scaling as torch's GradScaler,
and the bytes per parameter by category, to the byte."""
import numpy as np
import pytest

import ag
from ag import amp, trace

HALVES = ["float16", "bfloat16"]


def dtype_of(name: str) -> np.dtype:
    if name == "bfloat16":
        pytest.importorskip("ml_dtypes")
    return np.dtype(np.float32) if name == "float32" else amp.compute_dtype(name)


def mlp(dtype, hidden: int = 30):
    return [ag.nn.Linear(20, hidden, seed=1, dtype=dtype, name="l1"), ag.nn.Linear(hidden, 5, seed=2, dtype=dtype, name="l2")]


def forward(layers, x):
    return ag.mean(ag.relu(layers[1](ag.relu(layers[0](x)))))


def one_traced_step(name: str, rng):
    """One Adam step of the MLP, model and optimizer made inside the timeline; the last snapshot is
    taken after the step, before zero_grad."""
    dtype = dtype_of(name)
    x = ag.Tensor(rng.standard_normal((64, 20)).astype(dtype))
    with trace.tracing() as timeline:
        layers = mlp(dtype)
        params = [p for layer in layers for p in layer.parameters()]
        opt = ag.optim.Adam(params) if name == "float32" else amp.MixedPrecision(params, ag.optim.Adam)
        loss = forward(layers, x)
        loss.backward()
        opt.step()
    return timeline, sum(p.size for p in params), loss


# ---- bytes per parameter, ZeRO's accounting ----

def test_float32_adam_holds_4_plus_4_plus_8_bytes_a_parameter(rng):
    timeline, psi, loss = one_traced_step("float32", rng)
    c = timeline[-1].categories
    assert (c["parameters"], c["gradients"], c["optimizer state"]) == (4 * psi, 4 * psi, 8 * psi)
    assert c["activations kept"] == loss.value.nbytes
    assert sum(c.values()) == timeline[-1].allocated_bytes


@pytest.mark.parametrize("name", HALVES)
def test_mixed_precision_adam_holds_2_plus_2_plus_12_bytes_a_parameter(name, rng):
    timeline, psi, loss = one_traced_step(name, rng)
    c = timeline[-1].categories
    assert (c["parameters"], c["gradients"], c["optimizer state"]) == (2 * psi, 2 * psi, 12 * psi)
    assert c["activations kept"] == loss.value.nbytes
    assert c["parameters"] + c["gradients"] + c["optimizer state"] == 16 * psi


@pytest.mark.parametrize("name", HALVES)
def test_the_master_copies_are_optimizer_state_named_after_their_parameter(name, rng):
    timeline, *_ = one_traced_step(name, rng)
    masters = {b.name: b for b in timeline[-1].buffers if b.name.endswith(".master")}
    assert sorted(masters) == ["l1.bias.master", "l1.weight.master", "l2.bias.master", "l2.weight.master"]
    assert all(b.category == "optimizer state" and b.dtype == "float32" for b in masters.values())


@pytest.mark.parametrize("name", HALVES)
def test_16_bit_compute_halves_the_activations(name, rng):
    kept = {}
    for dtype_name in ("float32", name):
        dtype = dtype_of(dtype_name)
        layers = mlp(dtype)
        x = ag.Tensor(rng.standard_normal((64, 20)).astype(dtype))
        with trace.tracing() as timeline:
            forward(layers, x)
        kept[dtype_name] = timeline[-1].categories["activations kept"]
    assert kept[name] * 2 == kept["float32"]


def test_the_float32_grad_of_one_parameter_is_a_temporary_of_the_step(rng):
    timeline, *_ = one_traced_step("float16", rng)
    during = [s for s in timeline if s.op == "Adam" and s.tensor == "l1.weight"]
    assert during[0].categories["temporaries"] >= 20 * 30 * 4  # l1.weight's float32 grad, alive during its step


# ---- master weights ----

def test_master_weights_keep_updates_that_16_bit_weights_round_away():
    lone = ag.Tensor(np.ones(4, np.float16), requires_grad=True)
    mixed = ag.Tensor(np.ones(4, np.float16), requires_grad=True)
    mixed_opt = amp.MixedPrecision([mixed], ag.optim.SGD, lr=1e-4)
    for _ in range(100):
        lone.value -= np.float16(1e-4) * np.ones(4, np.float16)  # a float16 weight stepped alone
        mixed.grad = np.ones(4, np.float16)
        mixed_opt.step()
    assert np.all(lone.value == 1.0)  # 1 − 1e-4 rounds back to 1 in float16
    np.testing.assert_allclose(mixed.value, np.float16(0.99), rtol=0, atol=1e-3)


@pytest.mark.parametrize("name", HALVES)
def test_mixed_precision_training_follows_float32(name, rng):
    x = rng.standard_normal((64, 20))
    losses = {}
    for dtype_name in ("float32", name):
        dtype = dtype_of(dtype_name)
        layers = mlp(dtype)
        params = [p for layer in layers for p in layer.parameters()]
        opt = ag.optim.Adam(params, lr=1e-2) if dtype_name == "float32" else amp.MixedPrecision(params, lr=1e-2)
        losses[dtype_name] = []
        for _ in range(30):
            loss = forward(layers, ag.Tensor(x.astype(dtype)))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[dtype_name].append(float(loss.value))
    assert losses["float32"][-1] < 0.5 * losses["float32"][0]
    np.testing.assert_allclose(losses[name], losses["float32"], rtol=0.05, atol=2e-3)


# ---- dynamic loss scaling ----

PATTERN = ["ok", "ok", "inf", "ok", "ok", "ok", "ok", "nan", "ok", "ok", "ok", "inf", "inf", "ok"]


def test_the_loss_scale_follows_torch_grad_scaler_step_for_step(torch_or_skip):
    torch = torch_or_skip
    twin = torch.nn.Parameter(torch.ones(3))
    torch_opt = torch.optim.SGD([twin], lr=0.1)
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    p = ag.Tensor(np.ones(3, np.float16), requires_grad=True)
    opt = amp.MixedPrecision([p], ag.optim.SGD, lr=0.1)
    scaler = amp.LossScaler(init_scale=8.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    for i, kind in enumerate(PATTERN):
        bad = {"ok": 1.0, "inf": np.inf, "nan": np.nan}[kind]
        torch_scaler.scale(torch.ones(()))  # GradScaler makes its scale on the first scale()
        twin.grad = torch.tensor([1.0, bad, 1.0]) * torch_scaler.get_scale()
        p.grad = np.array([1.0, bad, 1.0], np.float16) * np.float16(scaler.scale_value)
        torch_scaler.step(torch_opt)
        stepped = scaler.step(opt)
        torch_scaler.update()
        scaler.update()
        assert stepped == (kind == "ok"), i
        assert scaler.scale_value == torch_scaler.get_scale(), (i, kind)
        np.testing.assert_allclose(opt.master[0].value, twin.detach().numpy(), rtol=1e-6, err_msg=str(i))


def test_an_overflowing_step_is_skipped_leaving_weights_and_state_untouched():
    p = ag.Tensor(np.full(4, 0.5, np.float16), requires_grad=True)
    opt = amp.MixedPrecision([p], ag.optim.Adam, lr=0.1)
    scaler = amp.LossScaler(init_scale=2.0 ** 16)
    loss = ag.sum(p * p)
    scaler.scale(loss).backward()  # 65536 is past float16's 65504: the scaled loss is inf
    assert not scaler.step(opt)
    scaler.update()
    assert np.all(p.value == np.float16(0.5)) and opt.optimizer.state_bytes() == 0
    assert scaler.scale_value == 2.0 ** 15


def test_the_scale_grows_after_growth_interval_good_steps_in_a_row():
    p = ag.Tensor(np.ones(2, np.float16), requires_grad=True)
    opt = amp.MixedPrecision([p], ag.optim.SGD, lr=0.0)
    scaler = amp.LossScaler(init_scale=4.0, growth_interval=2)
    scales = []
    for _ in range(5):
        p.grad = np.ones(2, np.float16)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.scale_value)
    assert scales == [4.0, 8.0, 8.0, 16.0, 16.0]


def test_grads_are_unscaled_before_the_step():
    p = ag.Tensor(np.zeros(2, np.float16), requires_grad=True)
    opt = amp.MixedPrecision([p], ag.optim.SGD, lr=1.0)
    scaler = amp.LossScaler(init_scale=1024.0)
    scaler.scale(ag.sum(p * ag.Tensor(np.array([1.0, -2.0], np.float16)))).backward()
    np.testing.assert_array_equal(p.grad, np.array([1024.0, -2048.0], np.float16))
    scaler.step(opt)
    np.testing.assert_array_equal(p.value, np.array([-1.0, 2.0], np.float16))


# ---- bad input ----

def test_a_float32_parameter_is_refused_naming_the_16_bit_dtypes():
    p = ag.Tensor(np.ones(3, np.float32), requires_grad=True, name="w")
    with pytest.raises(TypeError, match=r"params\[0\] is tensor 'w' of dtype float32.*expected a float16 or bfloat16"):
        amp.MixedPrecision([p])


def test_a_parameter_that_is_not_a_leaf_is_refused():
    p = ag.Tensor(np.ones(3, np.float16), requires_grad=True)
    with pytest.raises(ValueError, match=r"params\[0\].*not a leaf"):
        amp.MixedPrecision([p * p])


def test_an_unknown_compute_dtype_is_refused_naming_both():
    with pytest.raises(ValueError, match="'float16' or 'bfloat16', got 'int8'"):
        amp.compute_dtype("int8")


def test_a_loss_scaler_that_would_not_back_off_is_refused():
    with pytest.raises(ValueError, match="0 < backoff_factor < 1"):
        amp.LossScaler(backoff_factor=1.5)


# ---- resuming from a checkpoint ----

def mixed_run(steps: int, state=None, tmp_path=None):
    """An MLP in float16 stepped by MixedPrecision(Adam) under a LossScaler whose first scale overflows;
    from a checkpoint file if ``state`` names one. Returns (layers, optimizer, scaler, losses)."""
    dtype = np.dtype(np.float16)
    layers = mlp(dtype)
    params = [p for layer in layers for p in layer.parameters()]
    opt = amp.MixedPrecision(params, ag.optim.Adam, lr=1e-2)
    scaler = amp.LossScaler(init_scale=2.0 ** 20, growth_interval=3)
    first = 0 if state is None else ag.train.load_checkpoint(state, params, opt, scaler)
    losses = []
    for step in range(first, first + steps):
        x = np.random.default_rng(step).standard_normal((64, 20)).astype(dtype)
        loss = forward(layers, ag.Tensor(x))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        losses.append(float(loss.value))
    return params, opt, scaler, losses


def test_mixed_precision_resumed_from_a_checkpoint_equals_an_unbroken_run_bit_for_bit(tmp_path):
    """Master copies, Adam's m and v and step counts, the loss scale and its count of good steps all
    travel through np.savez: k steps, save, load into fresh objects, k more equal 2k straight steps."""
    k = 8
    params, opt, scaler, first_losses = mixed_run(k)
    ag.train.save_checkpoint(tmp_path / "run.npz", params, opt, step=k, scaler=scaler)
    resumed, resumed_opt, resumed_scaler, later_losses = mixed_run(k, tmp_path / "run.npz")
    straight, straight_opt, straight_scaler, losses = mixed_run(2 * k)
    assert straight_scaler.scale_value < 2.0 ** 20  # the run skipped steps and backed off
    assert first_losses + later_losses == losses
    for a, b in zip(resumed + resumed_opt.master, straight + straight_opt.master):
        assert a.value.dtype == b.value.dtype and np.array_equal(a.value, b.value)
    assert resumed_scaler.state_dict() == straight_scaler.state_dict()


def test_the_state_dict_holds_every_master_copy_before_the_first_step():
    p = ag.Tensor(np.ones(3, np.float16), requires_grad=True)
    saved = amp.MixedPrecision([p], ag.optim.Adam).state_dict()
    assert list(saved["state"]) == [0] and set(saved["state"][0]) == {"master"}
    assert saved["state"][0]["master"].dtype == np.float32


def test_loading_rounds_the_master_copies_into_the_16_bit_parameters():
    source = ag.Tensor(np.full(2, 0.1, np.float16), requires_grad=True)
    opt = amp.MixedPrecision([source], ag.optim.SGD, lr=0.0)
    opt.master[0].value[:] = np.float32(0.3)
    target = ag.Tensor(np.zeros(2, np.float16), requires_grad=True)
    fresh = amp.MixedPrecision([target], ag.optim.SGD, lr=0.0)
    fresh.load_state_dict(opt.state_dict())
    assert np.array_equal(target.value, np.full(2, np.float16(0.3)))
    assert np.array_equal(fresh.master[0].value, np.full(2, np.float32(0.3)))


def test_a_state_dict_without_a_master_copy_is_refused_naming_it():
    p = ag.Tensor(np.ones((2, 3), np.float16), requires_grad=True)
    saved = amp.MixedPrecision([p], ag.optim.Adam).state_dict()
    saved["state"][0]["master"] = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"state 0's master copy is \(3,\) float32; expected \(2, 3\) float32"):
        amp.MixedPrecision([p], ag.optim.Adam).load_state_dict(saved)


def test_a_loss_scaler_state_dict_with_missing_keys_is_refused_naming_them():
    with pytest.raises(ValueError, match=r"expected the keys \['backoff_factor', 'growth_factor'"):
        amp.LossScaler().load_state_dict({"scale": 8.0})
