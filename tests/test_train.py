"""ag.train: models trained on real data (digits, the Zen of Python), beside torch from the same
weights, with a progress bar and checkpoints that resume a run exactly."""
import io
import time

import numpy as np
import pytest

import ag
from ag import train


def digits_or_skip():
    pytest.importorskip("sklearn", reason="needs scikit-learn (ag[data])")
    return train.load_digits_split()


# ---- digits ----

@pytest.mark.slow
def test_an_mlp_learns_the_digits_to_95_percent_in_under_30_seconds():
    x_train, y_train, x_test, y_test = digits_or_skip()
    start = time.perf_counter()
    model = train.DigitsMLP()
    opt = ag.optim.Adam(list(model.parameters()), lr=1e-2)
    train.fit(train.digits_loss_at(model, x_train, y_train), opt, range(500), progress=False)
    seconds = time.perf_counter() - start
    assert train.accuracy(model, x_test, y_test) >= 0.95
    assert seconds < 30, f"{seconds:.1f} s"


def test_the_digits_split_is_disjoint_scaled_and_stratified_enough():
    x_train, y_train, x_test, y_test = digits_or_skip()
    assert len(y_train) + len(y_test) == 1797 and len(y_test) == 449
    assert x_train.dtype == np.float32 and 0 <= x_train.min() and x_train.max() == 1
    assert set(np.unique(y_test)) == set(range(10))


@pytest.mark.oracle
def test_the_mlp_loss_curve_matches_torch_from_the_same_weights(torch_or_skip):
    torch = torch_or_skip
    F = torch.nn.functional
    x, y, *_ = digits_or_skip()
    model = train.DigitsMLP()
    twins = [torch.tensor(p.value.copy(), requires_grad=True) for p in model.parameters()]
    opt = ag.optim.Adam(list(model.parameters()), lr=1e-2)
    torch_opt = torch.optim.Adam(twins, lr=1e-2)
    losses = train.fit(train.digits_loss_at(model, x, y), opt, range(20), progress=False)
    w1, b1, w2, b2 = twins
    for t in range(20):
        i = train.batch_indices(t, len(y), 64, 0)
        loss = F.cross_entropy(torch.relu(torch.tensor(x[i]) @ w1 + b1) @ w2 + b2, torch.tensor(y[i]))
        loss.backward()
        torch_opt.step()
        torch_opt.zero_grad()
        assert losses[t] == pytest.approx(loss.item(), rel=1e-5, abs=1e-6), t


# ---- the character-level transformer ----

def test_the_zen_of_python_is_read_without_printing_it(capsys):
    text = train.zen_text()
    assert text.startswith("The Zen of Python, by Tim Peters") and "Namespaces are one honking great idea" in text
    assert capsys.readouterr().out == ""


def small_transformer(alphabet: str):
    return train.CharTransformer(len(alphabet), context=16, hidden=32, heads=2, num_layers=2, seed=3)


def torch_transformer(torch, model):
    """A torch twin of ``model``: the same weights as leaf tensors, and its forward with torch's ops."""
    F = torch.nn.functional
    twin = {id(p): torch.tensor(p.value.copy(), requires_grad=True) for p in model.parameters()}
    w = lambda p: twin[id(p)]  # noqa: E731
    h = model.embedding.shape[1]

    def layer_forward(layer, x):
        s, b, _ = x.shape
        a, d = layer.attention.a, layer.attention.d
        qkv = F.layer_norm(x, (h,), w(layer.ln1.weight), w(layer.ln1.bias)) @ w(layer.attention.qkv.weight) \
            + w(layer.attention.qkv.bias)
        q, k, v = (qkv[..., i * h:(i + 1) * h].reshape(s, b, a, d).permute(1, 2, 0, 3) for i in range(3))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = x + o.permute(2, 0, 1, 3).reshape(s, b, h) @ w(layer.attention.proj.weight) + w(layer.attention.proj.bias)
        m = F.gelu(F.layer_norm(y, (h,), w(layer.ln2.weight), w(layer.ln2.bias)) @ w(layer.mlp.fc1.weight)
                   + w(layer.mlp.fc1.bias), approximate="tanh")
        return y + m @ w(layer.mlp.fc2.weight) + w(layer.mlp.fc2.bias)

    def forward(tokens):
        s, b = tokens.shape[1], tokens.shape[0]
        x = w(model.embedding)[torch.tensor(tokens.T)] + w(model.positions)[:s].reshape(s, 1, h)
        for layer in model.body.layers:
            x = layer_forward(layer, x)
        x = F.layer_norm(x, (h,), w(model.ln.weight), w(model.ln.bias)).reshape(s * b, h)
        return x @ w(model.head.weight) + w(model.head.bias)
    return forward, [twin[id(p)] for p in model.parameters()]


@pytest.mark.oracle
def test_the_transformer_loss_curve_matches_torch_from_the_same_weights(torch_or_skip):
    torch = torch_or_skip
    tokens, alphabet = train.encode(train.zen_text())
    model = small_transformer(alphabet)
    forward, twins = torch_transformer(torch, model)
    opt = ag.optim.Adam(list(model.parameters()), lr=3e-3)
    torch_opt = torch.optim.Adam(twins, lr=3e-3)
    losses = train.fit(train.text_loss_at(model, tokens, batch=8), opt, range(5), progress=False)
    for t in range(5):
        x, y = train.text_batch(tokens, t, 8, 16, seed=0)
        loss = torch.nn.functional.cross_entropy(forward(x), torch.tensor(y))
        loss.backward()
        torch_opt.step()
        torch_opt.zero_grad()
        assert losses[t] == pytest.approx(loss.item(), rel=1e-5), t


@pytest.mark.slow
def test_the_transformer_loss_falls_on_the_zen_of_python():
    tokens, alphabet = train.encode(train.zen_text())
    model = small_transformer(alphabet)
    opt = ag.optim.Adam(list(model.parameters()), lr=1e-2)
    losses = train.fit(train.text_loss_at(model, tokens, batch=8), opt, range(60), progress=False)
    assert losses[0] == pytest.approx(np.log(len(alphabet)), rel=0.05)  # uniform guesses at the start
    assert np.mean(losses[-10:]) < losses[0] - 0.8


def test_a_sequence_longer_than_the_context_is_refused():
    model = train.CharTransformer(10, context=8, hidden=16, heads=2, num_layers=1)
    with pytest.raises(ValueError, match="12 tokens is longer than the context of 8"):
        model(np.zeros((2, 12), np.int64))


# ---- the loop's parts ----

@pytest.mark.oracle
def test_cross_entropy_matches_torch(rng, torch_or_skip):
    torch = torch_or_skip
    logits, targets = rng.standard_normal((6, 4)), rng.integers(0, 4, 6)
    z = ag.Tensor(logits, requires_grad=True)
    loss = train.cross_entropy(z, targets)
    loss.backward()
    twin = torch.tensor(logits, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(twin, torch.tensor(targets))
    expected.backward()
    assert float(loss.value) == pytest.approx(expected.item(), rel=1e-12)
    np.testing.assert_allclose(z.grad, twin.grad.numpy(), rtol=1e-12)


def test_cross_entropy_refuses_targets_that_do_not_match_the_rows():
    with pytest.raises(ValueError, match=r"logits \(3, 4\) and targets \(2,\)"):
        train.cross_entropy(ag.Tensor(np.zeros((3, 4))), np.zeros(2, np.int64))


def test_the_progress_bar_redraws_at_most_once_a_percent_and_ends_full():
    stream = io.StringIO()
    bar = train.Progress(1000, "digits", width=10, stream=stream)
    for _ in range(1000):
        bar.update(0.25)
    bar.close()
    lines = stream.getvalue().split("\r")[1:]
    assert len(lines) == 100
    assert lines[-1] == "digits [##########] 1000/1000 loss 0.250\n"


# ---- checkpoints ----

def mlp_run(rng_seed: int):
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((200, 64)).astype(np.float32), rng.integers(0, 10, 200)
    model = train.DigitsMLP(hidden=16, seed=rng_seed)
    opt = ag.optim.Adam(list(model.parameters()), lr=1e-2)
    return model, opt, train.digits_loss_at(model, x, y, batch=32)


def test_a_run_resumed_from_a_checkpoint_equals_an_unbroken_run_bit_for_bit(tmp_path):
    model, opt, loss_at = mlp_run(0)
    unbroken = train.fit(loss_at, opt, range(40), progress=False)
    first, first_opt, first_loss_at = mlp_run(0)
    head = train.fit(first_loss_at, first_opt, range(20), progress=False)
    train.save_checkpoint(tmp_path / "run.npz", list(first.parameters()), first_opt, step=20)
    resumed, resumed_opt, resumed_loss_at = mlp_run(1)  # another initialization, overwritten by the load
    start = train.load_checkpoint(tmp_path / "run.npz", list(resumed.parameters()), resumed_opt)
    tail = train.fit(resumed_loss_at, resumed_opt, range(start, 40), progress=False)
    assert head + tail == unbroken
    for p, q in zip(model.parameters(), resumed.parameters()):
        np.testing.assert_array_equal(p.value, q.value)
    for (_, name, a), (_, _, b) in zip(opt.named_state(), resumed_opt.named_state()):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_a_checkpoint_of_another_model_is_refused_naming_the_shapes(tmp_path):
    model, opt, loss_at = mlp_run(0)
    train.fit(loss_at, opt, range(1), progress=False)
    train.save_checkpoint(tmp_path / "run.npz", list(model.parameters()), opt, step=1)
    other = train.DigitsMLP(hidden=8)
    with pytest.raises(ValueError, match=r"parameter 0 as \(64, 16\) float32, expected \(64, 8\) float32"):
        train.load_checkpoint(tmp_path / "run.npz", list(other.parameters()), ag.optim.Adam(list(other.parameters())))
