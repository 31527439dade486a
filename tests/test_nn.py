"""ag.nn: the transformer layer keeps, to the byte, what Korthikanti et al. 2022 count.

Memory is measured with tracemalloc, counting only NumPy's data buffers (NumPy reports them
in their own domain), so Python's object headers do not blur the figures: bytes alive after
the forward, minus its output (the next layer's input), plus its input (which the first layer
norm saves), as ``ag.trace.measure_activation_bytes`` counts them.
"""
import tracemalloc

import numpy as np
import pytest

import ag
from ag import memory_model, nn
from ag.trace import measure_activation_bytes
from gradcheck import grad_check, torch_check

SHAPES = [  # (s, b, h, a, num_query_groups)
    (64, 2, 64, 4, None),
    (256, 1, 32, 2, None),   # s ≫ h: the scores dominate
    (8, 4, 256, 4, None),    # s ≪ h: the 34sbh part dominates
    (64, 2, 64, 4, 2),       # GQA
    (64, 2, 64, 4, 1),       # MQA
]


def layer_input(s, b, h, dtype, seed=0) -> ag.Tensor:
    x = np.random.default_rng(seed).standard_normal((s, b, h)).astype(dtype)
    return ag.Tensor(x, requires_grad=True)


@pytest.mark.parametrize("granularity", [None, "selective", "full"])
@pytest.mark.parametrize("s,b,h,a,g", SHAPES)
def test_float16_layer_keeps_exactly_the_papers_bytes(s, b, h, a, g, granularity):
    layer = nn.TransformerLayer(h, a, num_query_groups=g, activations_checkpoint_granularity=granularity,
                                dtype=np.float16, seed=3)
    measured = measure_activation_bytes(layer, layer_input(s, b, h, np.float16))
    expected = memory_model.activation_bytes_per_layer(s, b, h, a, num_query_groups=g, recompute=granularity)
    assert measured == expected, f"measured {measured} B, formula {expected} B"


def test_the_no_recomputation_figure_is_sbh_34_plus_5as_over_h():
    s, b, h, a = 64, 2, 64, 4
    layer = nn.TransformerLayer(h, a, dtype=np.float16)
    measured = measure_activation_bytes(layer, layer_input(s, b, h, np.float16))
    assert measured == s * b * h * (34 + 5 * a * s // h)


@pytest.mark.parametrize("dtype,bytes_per_value", [(np.float32, 4), (np.float64, 8)])
def test_wider_activations_double_the_values_but_not_the_masks(dtype, bytes_per_value):
    s, b, h, a = 32, 2, 32, 2
    layer = nn.TransformerLayer(h, a, dtype=dtype)
    measured = measure_activation_bytes(layer, layer_input(s, b, h, dtype))
    assert measured == memory_model.activation_bytes_per_layer(s, b, h, a, bytes_per_value=bytes_per_value)


@pytest.mark.parametrize("s,b,h,a,g", SHAPES)
def test_flash_attention_layer_keeps_the_selective_bytes_plus_its_logsumexp(s, b, h, a, g):
    layer = nn.TransformerLayer(h, a, num_query_groups=g, attention="flash", dtype=np.float16)
    measured = measure_activation_bytes(layer, layer_input(s, b, h, np.float16))
    selective = memory_model.activation_bytes_per_layer(s, b, h, a, num_query_groups=g, recompute="selective")
    assert measured == selective + a * s * b * 4  # lse: one float32 per (head, query), as FlashAttention keeps it
    assert measured <= 1.01 * selective


def test_no_score_sized_array_survives_a_selective_forward():
    s, b, h, a = 128, 1, 16, 2
    layer = nn.TransformerLayer(h, a, activations_checkpoint_granularity="selective", dtype=np.float16)
    x = layer_input(s, b, h, np.float16)
    tracemalloc.start()
    out = layer(x)
    sizes = [t.size for t in tracemalloc.take_snapshot().traces if t.domain == np.lib.tracemalloc_domain]
    tracemalloc.stop()
    assert max(sizes) < a * s * s * b, f"an array of {max(sizes)} B (scores are {a * s * s * b * 2} B) is alive"
    assert out.shape == (s, b, h)


# ---- a stack with NeMo's full-recomputation methods ----

@pytest.mark.parametrize("method,n", [("uniform", 1), ("uniform", 2), ("uniform", 3), ("block", 1), ("block", 3)])
def test_full_recomputation_of_a_stack_keeps_what_the_method_says(method, n):
    L, s, b, h, a = 4, 32, 2, 32, 2
    model = nn.Transformer(L, h, a, activations_checkpoint_granularity="full",
                           activations_checkpoint_method=method, activations_checkpoint_num_layers=n,
                           dtype=np.float16)
    measured = measure_activation_bytes(model, layer_input(s, b, h, np.float16))
    full = memory_model.activation_bytes_per_layer(s, b, h, a)
    kept_input = memory_model.activation_bytes_per_layer(s, b, h, a, recompute="full")
    expected = -(-L // n) * kept_input if method == "uniform" else n * kept_input + (L - n) * full
    assert measured == expected


def test_a_stack_without_recomputation_keeps_L_layers():
    L, s, b, h, a = 3, 32, 2, 32, 2
    model = nn.Transformer(L, h, a, dtype=np.float16)
    measured = measure_activation_bytes(model, layer_input(s, b, h, np.float16))
    assert measured == memory_model.activation_bytes(L, s, b, h, a)


# ---- gradients do not depend on what is recomputed ----

def _grads(model, x: np.ndarray, dy: np.ndarray) -> list[np.ndarray]:
    t = ag.Tensor(x.copy(), requires_grad=True)
    out = model(t)
    out.backward(dy)
    return [out.value, t.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("g", [None, 2])
def test_layer_gradients_are_identical_across_recomputation_modes(g):
    s, b, h, a = 16, 2, 32, 4
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((s, b, h)), rng.standard_normal((s, b, h))
    results = {mode: _grads(nn.TransformerLayer(h, a, num_query_groups=g, activations_checkpoint_granularity=mode,
                                                dtype=np.float64, seed=7), x, dy)
               for mode in (None, "selective", "full")}
    for mode in ("selective", "full"):
        assert len(results[mode]) == len(results[None]) == 2 + 12
        for got, want in zip(results[mode], results[None]):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=mode)


@pytest.mark.parametrize("granularity,method,n", [("selective", "uniform", 1), ("full", "uniform", 1),
                                                  ("full", "uniform", 2), ("full", "block", 3)])
def test_stack_gradients_are_identical_across_recomputation_modes(granularity, method, n):
    L, s, b, h, a = 4, 8, 2, 16, 2
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((s, b, h)), rng.standard_normal((s, b, h))

    def build(**options):
        return nn.Transformer(L, h, a, dtype=np.float64, seed=5, **options)
    want = _grads(build(), x, dy)
    got = _grads(build(activations_checkpoint_granularity=granularity, activations_checkpoint_method=method,
                       activations_checkpoint_num_layers=n), x, dy)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_flash_and_naive_layers_agree_without_dropout():
    s, b, h, a = 24, 2, 32, 4
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((s, b, h)), rng.standard_normal((s, b, h))
    naive = _grads(nn.TransformerLayer(h, a, dropout=0.0, dtype=np.float64, seed=1), x, dy)
    flash = _grads(nn.TransformerLayer(h, a, dropout=0.0, attention="flash", dtype=np.float64, seed=1), x, dy)
    for f, n_ in zip(flash, naive):
        np.testing.assert_allclose(f, n_, rtol=1e-9, atol=1e-12)


def test_dropout_masks_differ_between_calls_but_replay_identically():
    layer = nn.TransformerLayer(16, 2, dropout=0.5, dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((4, 1, 16))
    first, second = layer(ag.Tensor(x)).value, layer(ag.Tensor(x)).value
    assert not np.allclose(first, second)
    assert np.array_equal(layer.forward_with((0,))(ag.Tensor(x)).value, first)


# ---- the ops the layer is made of ----

def test_layer_norm_gradients(rng):
    grad_check(lambda x, g, b: ag.layer_norm(x, g, b), rng.standard_normal((3, 5)),
               rng.standard_normal(5), rng.standard_normal(5), rtol=1e-5)


def test_scaled_masked_softmax_gradients(rng):
    grad_check(lambda s: ag.scaled_masked_softmax(s, 0.5, causal=True), rng.standard_normal((2, 4, 4)), rtol=1e-5)


def test_dropout_gradient_uses_the_forward_mask(rng):
    x = ag.Tensor(rng.standard_normal((50, 50)), requires_grad=True)
    y = ag.dropout(x, 0.3, np.random.default_rng(1))
    y.backward(np.ones((50, 50)))
    kept = y.value != 0
    np.testing.assert_allclose(x.grad, kept / 0.7)
    assert 0.6 < kept.mean() < 0.8


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_keep_mask_keeps_each_element_with_probability_1_minus_p_and_its_chunks_differ(p, monkeypatch):
    from ag.ops import fused
    monkeypatch.setattr(fused, "MASK_CHUNK", 1 << 14)
    n = 1 << 20
    mask = fused.keep_mask(np.random.default_rng(0), (n,), p)
    assert mask.dtype == np.bool_ and mask.shape == (n,)
    sigma = np.sqrt(n * p * (1 - p))
    assert abs(mask.sum() - n * (1 - p)) <= 6 * sigma, (mask.sum(), n * (1 - p))
    if p:
        chunks = mask.reshape(-1, 1 << 14)
        assert len({c.tobytes() for c in chunks}) == len(chunks)  # each chunk its own generator's draws
        runs = np.mean(mask[1:] == mask[:-1])  # neighbours independent: P(equal) = p² + (1 - p)²
        assert abs(runs - (p * p + (1 - p) ** 2)) < 0.01


def test_keep_mask_is_fixed_by_the_generator_and_advances_it():
    from ag.ops.fused import keep_mask
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    first = keep_mask(a, (40, 50), 0.3)
    np.testing.assert_array_equal(first, keep_mask(b, (40, 50), 0.3))
    assert not np.array_equal(first, keep_mask(a, (40, 50), 0.3))


@pytest.mark.oracle
def test_layer_norm_matches_torch(rng, torch_or_skip):
    torch = torch_or_skip
    torch_check(lambda x, g, b: ag.layer_norm(x, g, b),
                lambda x, g, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, eps=1e-5),
                rng.standard_normal((3, 4, 8)), rng.standard_normal(8), rng.standard_normal(8), rtol=1e-6)


@pytest.mark.oracle
@pytest.mark.parametrize("g", [None, 2, 1])
def test_transformer_layer_matches_torch(g, torch_or_skip):
    torch = torch_or_skip
    F = torch.nn.functional
    s, b, h, a = 12, 2, 32, 4
    layer = nn.TransformerLayer(h, a, num_query_groups=g, dropout=0.0, dtype=np.float64, seed=4)
    groups, d = layer.attention.groups, h // a
    params = [p.value for p in layer.parameters()]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((s, b, h))

    def torch_layer(x, *p):
        ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b = p
        qkv = F.layer_norm(x, (h,), ln1_w, ln1_b) @ qkv_w + qkv_b
        q = qkv[..., :h].reshape(s, b, a, d).permute(1, 2, 0, 3)
        k = qkv[..., h:h + groups * d].reshape(s, b, groups, d).permute(1, 2, 0, 3)
        v = qkv[..., h + groups * d:].reshape(s, b, groups, d).permute(1, 2, 0, 3)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        y = x + o.permute(2, 0, 1, 3).reshape(s, b, h) @ proj_w + proj_b
        m = F.gelu(F.layer_norm(y, (h,), ln2_w, ln2_b) @ fc1_w + fc1_b, approximate="tanh")
        return y + m @ fc2_w + fc2_b

    def ag_layer(x, *p):
        modules = [layer.ln1, layer.attention.qkv, layer.attention.proj, layer.ln2, layer.mlp.fc1, layer.mlp.fc2]
        for module, weight, bias in zip(modules, p[0::2], p[1::2]):
            module.weight, module.bias = weight, bias  # the checker's tensors, so their grads are compared
        return layer(x)
    torch_check(ag_layer, torch_layer, x, *params, rtol=1e-9, atol=1e-11)


# ---- bad configurations ----

@pytest.mark.parametrize("kwargs,message", [
    (dict(hidden_size=30, num_heads=4), "not divisible by num_heads"),
    (dict(hidden_size=32, num_heads=4, num_query_groups=3), "not divisible by num_query_groups"),
    (dict(hidden_size=32, num_heads=4, attention="fast"), "'naive' or 'flash'"),
    (dict(hidden_size=32, num_heads=4, activations_checkpoint_granularity="some"), "'selective' or 'full'"),
    (dict(hidden_size=32, num_heads=4, dropout=1.0), "p must be in [0, 1)"),
])
def test_bad_layer_configurations_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        nn.TransformerLayer(**kwargs)


def test_an_input_of_the_wrong_hidden_size_is_refused():
    layer = nn.TransformerLayer(32, 4)
    with pytest.raises(ValueError, match=r"TransformerLayer: expected input of shape \(s, b, 32\), got \(4, 1, 16\)"):
        layer(ag.Tensor(np.zeros((4, 1, 16), np.float32)))


def test_bad_stack_options_are_refused():
    with pytest.raises(ValueError, match="activations_checkpoint_method"):
        nn.Transformer(2, 16, 2, activations_checkpoint_granularity="full", activations_checkpoint_method="chunk")
    with pytest.raises(ValueError, match=r"activations_checkpoint_num_layers must be in 1\.\.2"):
        nn.Transformer(2, 16, 2, activations_checkpoint_granularity="full", activations_checkpoint_num_layers=3)
