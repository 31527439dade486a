"""ag.attention.gpu on a GPU: the CUDA kernels against the float64 reference (ag's naive attention,
its engine gradients and the NumPy path's logsumexp) over the grid the NumPy path is tested on.

Skipped, with the reason, where CuPy or a GPU is missing. Unlike the rest of the suite the inputs are
fresh random numbers on every run (each failure message gives the seed to reproduce it), and every
output array is filled with NaN before the launch, so an element that no thread writes fails.
"""
import numpy as np
import pytest

import ag
from ag.attention import gpu
from ag.attention import flash_attention, naive_attention

AVAILABLE, REASON = gpu.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=REASON)

SIZES = [(1, 1), (7, 7), (33, 33), (127, 127), (257, 257), (7, 33), (33, 7), (127, 257), (257, 1), (1, 257),
         (257, 33)]
HEAD_DIMS = [16, 64, 80, 128]
HEADS = [(8, 8), (8, 2), (8, 1)]
CAUSAL = [False, True, "bottom_right"]
FLOAT32_TOLERANCE = 1e-4


@pytest.fixture
def fresh():
    """(rng, seed): new random inputs on every run; the seed goes into failure messages."""
    seed = int(np.random.SeedSequence().entropy % 2**63)
    return np.random.default_rng(seed), seed


def cupy():
    import cupy
    return cupy


def inputs(rng, n_q, n_k, d, h, h_kv, lead=(2,)):
    """q, k, v and the output grad do, float32 standard normal, on the host."""
    shapes = [lead + (h, n_q, d), lead + (h_kv, n_k, d), lead + (h_kv, n_k, d), lead + (h, n_q, d)]
    return [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]


def reference(q, k, v, do, causal, scale=None):
    """float64 O, lse and [dq, dk, dv] of sum(O ∘ do): ag's naive attention through the engine."""
    tensors = [ag.Tensor(x.astype(np.float64), requires_grad=True) for x in (q, k, v)]
    out = naive_attention(*tensors, causal=causal, scale=scale)
    ag.sum(out * do.astype(np.float64)).backward()
    _, lse = flash_attention(*(t.value for t in tensors), causal=causal, scale=scale, return_lse=True)
    return out.value, lse, [t.grad for t in tensors]


def poisoned(*shapes):
    """float32 device arrays full of NaN."""
    cp = cupy()
    return tuple(cp.full(shape, cp.nan, dtype=cp.float32) for shape in shapes)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max(max |want|, 1); -inf where both are -inf counts as equal, NaN as infinitely wrong."""
    if np.isnan(got).any() or not np.array_equal(np.isneginf(got), np.isneginf(want)):
        return np.inf
    finite = np.isfinite(want)
    if not finite.any():
        return 0.0
    return float(np.max(np.abs(got[finite] - want[finite])) / max(np.max(np.abs(want[finite])), 1.0))


def run_float32(q, k, v, do, causal, scale=None):
    """The kernels' (o, lse, [dq, dk, dv]) on the host, every output poisoned before its launch."""
    cp = cupy()
    qd, kd, vd, dod = (cp.asarray(x) for x in (q, k, v, do))
    o, lse = poisoned(q.shape, q.shape[:-1])
    gpu.forward(qd, kd, vd, causal=causal, scale=scale, out=(o, lse))
    grads = poisoned(q.shape, k.shape, v.shape)
    gpu.backward(qd, kd, vd, o, lse, dod, causal=causal, scale=scale, out=grads)
    return o.get(), lse.get(), [g.get() for g in grads]


def assert_close(got, want, seed, what: str) -> None:
    error = relative_error(got, want)
    assert error <= FLOAT32_TOLERANCE, f"{what}: relative error {error:.2e} > {FLOAT32_TOLERANCE} (seed {seed})"


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("h, h_kv", HEADS)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("n_q, n_k", SIZES)
def test_float32_output_lse_and_all_three_gradients_match_float64(n_q, n_k, d, h, h_kv, causal, fresh):
    rng, seed = fresh
    q, k, v, do = inputs(rng, n_q, n_k, d, h, h_kv)
    want_o, want_lse, want_grads = reference(q, k, v, do, causal)
    o, lse, grads = run_float32(q, k, v, do, causal)
    assert_close(o, want_o, seed, "O")
    assert_close(lse, want_lse, seed, "lse")
    for name, got, want in zip(("dQ", "dK", "dV"), grads, want_grads):
        assert_close(got, want, seed, name)


def test_a_given_scale_and_two_leading_dimensions_are_honoured(fresh):
    rng, seed = fresh
    q, k, v, do = inputs(rng, 50, 70, 32, 4, 2, lead=(2, 3))
    want_o, want_lse, want_grads = reference(q, k, v, do, "bottom_right", scale=0.3)
    o, lse, grads = run_float32(q, k, v, do, "bottom_right", scale=0.3)
    for name, got, want in zip(("O", "lse", "dQ", "dK", "dV"), [o, lse] + grads, [want_o, want_lse] + want_grads):
        assert_close(got, want, seed, name)


@pytest.mark.parametrize("d", [17, 100])
def test_head_dims_that_are_not_multiples_of_16_are_padded_correctly(d, fresh):
    rng, seed = fresh
    q, k, v, do = inputs(rng, 65, 66, d, 4, 2)
    want_o, want_lse, want_grads = reference(q, k, v, do, True)
    o, lse, grads = run_float32(q, k, v, do, True)
    for name, got, want in zip(("O", "lse", "dQ", "dK", "dV"), [o, lse] + grads, [want_o, want_lse] + want_grads):
        assert_close(got, want, seed, name)


def test_fully_masked_rows_give_zero_output_zero_gradients_and_minus_infinite_lse(fresh):
    rng, seed = fresh
    q, k, v, do = inputs(rng, 100, 30, 64, 4, 2)  # bottom-right: rows 0..69 see no key
    o, lse, (dq, dk, dv) = run_float32(q, k, v, do, "bottom_right")
    assert not any(np.isnan(x).any() for x in (o, lse, dq, dk, dv)), f"NaN (seed {seed})"
    np.testing.assert_array_equal(o[..., :70, :], 0)
    np.testing.assert_array_equal(dq[..., :70, :], 0)
    assert np.isneginf(lse[..., :70]).all() and np.isfinite(lse[..., 70:]).all()
    o_bf16, lse_bf16 = (x.get() for x in gpu.forward_bf16(*(cupy().asarray(x) for x in (q, k, v)),
                                                                     causal="bottom_right"))
    np.testing.assert_array_equal(o_bf16[..., :70, :], 0)
    assert np.isneginf(lse_bf16[..., :70]).all() and not np.isnan(o_bf16).any()


def test_a_nan_reaches_the_rows_that_see_it_and_no_other_as_on_the_numpy_path(fresh):
    """A NaN in query row 7 makes that row of O NaN (the guard against 0/0 was l > 0, which also
    caught l = NaN and wrote 0), and a NaN in key 30 reaches only the causal rows that see it."""
    rng, seed = fresh
    q, k, v, _ = inputs(rng, 40, 40, 64, 4, 2)
    q[0, 1, 7, 3] = np.nan
    k[1, 1, 30, 5] = np.nan  # key/value head 1 serves query heads 2 and 3
    with np.errstate(invalid="ignore"):
        want = flash_attention(q, k, v, causal=True)
    assert np.isnan(want[0, 1, 7]).all() and np.isnan(want[1, 2:, 30:]).all() and np.isnan(want).sum() == 21 * 64
    cp = cupy()
    for forward in (gpu.forward, gpu.forward_bf16):
        o = forward(*(cp.asarray(x) for x in (q, k, v)), causal=True)[0].get()
        np.testing.assert_array_equal(np.isnan(o), np.isnan(want), err_msg=f"{forward.__name__} (seed {seed})")


def test_no_key_at_all_gives_zero_output_and_zero_query_gradients(fresh):
    rng, seed = fresh
    q, k, v, do = inputs(rng, 9, 0, 16, 2, 1)
    o, lse, (dq, dk, dv) = run_float32(q, k, v, do, False)
    np.testing.assert_array_equal(o, 0)
    np.testing.assert_array_equal(dq, 0)
    assert np.isneginf(lse).all() and dk.size == dv.size == 0


def test_gradients_are_the_same_bits_on_every_run(fresh):
    rng, seed = fresh
    q, k, v, do = inputs(rng, 300, 300, 64, 8, 1)  # MQA: dK, dV summed over 8 heads, in a fixed order
    first = run_float32(q, k, v, do, True)
    second = run_float32(q, k, v, do, True)
    for a, b in zip([first[0], first[1]] + first[2], [second[0], second[1]] + second[2]):
        np.testing.assert_array_equal(a, b)


def test_out_arrays_are_written_and_returned():
    cp = cupy()
    q = cp.ones((1, 2, 5, 16), dtype=cp.float32)
    o, lse = poisoned(q.shape, q.shape[:-1])
    assert all(a is b for a, b in zip(gpu.forward(q, q, q, out=(o, lse)), (o, lse)))
    assert not cp.isnan(o).any()


# ---- bfloat16 on the tensor cores ----

def round_bf16(x):
    return gpu.from_bfloat16(gpu.to_bfloat16(x))


def naive_bf16_probabilities(q, k, causal, scale):
    """P of naive attention the way bfloat16 tensors compute it, on the GPU: float32 arithmetic, every result
    (Q Kᵀ, its scaling, softmax) rounded to bfloat16."""
    cp = cupy()
    q, k = round_bf16(q), repeat_heads(round_bf16(k), q)
    s = round_bf16(round_bf16(q @ cp.swapaxes(k, -1, -2)) * cp.float32(scale))
    n_q, n_k = q.shape[-2], k.shape[-2]
    if causal:
        offset = n_k - n_q if causal == "bottom_right" else 0
        s = cp.where(cp.arange(n_k)[None, :] <= cp.arange(n_q)[:, None] + offset, s, -cp.inf)
    m = s.max(axis=-1, keepdims=True)
    p = cp.exp(s - cp.where(cp.isfinite(m), m, 0))
    row_sum = p.sum(axis=-1, keepdims=True)
    return round_bf16(cp.where(row_sum > 0, p / cp.where(row_sum > 0, row_sum, 1), 0).astype(cp.float32))


def repeat_heads(kv, q):
    """k or v with each key/value head repeated for the query heads of its GQA group."""
    return cupy().repeat(kv, q.shape[-3] // kv.shape[-3], axis=-3)


def naive_bf16(q, k, v, causal, scale):
    """Naive attention the way bfloat16 tensors compute it: P V of the rounded P, rounded to bfloat16."""
    return round_bf16(naive_bf16_probabilities(q, k, causal, scale) @ repeat_heads(round_bf16(v), q))


def naive_bf16_gradients(q, k, v, do, causal, scale):
    """dQ, dK, dV of naive attention the way bfloat16 tensors compute them: float32 arithmetic, every stored
    result (O, dV, dP, D = rowsum(dO ∘ O), dS, its scaling, dQ, dK) rounded to bfloat16; dK and dV summed
    over each GQA group, then rounded."""
    cp = cupy()
    p = naive_bf16_probabilities(q, k, causal, scale)
    q, do = round_bf16(q), round_bf16(do)
    k_rep, v_rep = repeat_heads(round_bf16(k), q), repeat_heads(round_bf16(v), q)
    o = round_bf16(p @ v_rep)
    dp = round_bf16(do @ cp.swapaxes(v_rep, -1, -2))
    D = round_bf16((do * o).sum(axis=-1, keepdims=True))
    ds = round_bf16(round_bf16(p * (dp - D)) * cp.float32(scale))

    def per_kv_head(x):
        x = round_bf16(x)
        return round_bf16(x.reshape(x.shape[:-3] + (k.shape[-3], -1) + x.shape[-2:]).sum(axis=-3))
    return round_bf16(ds @ k_rep), per_kv_head(cp.swapaxes(ds, -1, -2) @ q), per_kv_head(cp.swapaxes(p, -1, -2) @ do)


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("h, h_kv", HEADS)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("n_q, n_k", SIZES)
def test_bfloat16_error_is_within_twice_that_of_naive_bfloat16_attention(n_q, n_k, d, h, h_kv, causal, fresh):
    rng, seed = fresh
    cp = cupy()
    q, k, v, _ = inputs(rng, n_q, n_k, d, h, h_kv)
    want_o = naive_attention(*(x.astype(np.float64) for x in (q, k, v)), causal=causal)
    qd, kd, vd = (cp.asarray(x) for x in (q, k, v))
    o, lse = poisoned(q.shape, q.shape[:-1])
    gpu.forward_bf16(qd, kd, vd, causal=causal, out=(o, lse))
    o = o.get()
    error = np.max(np.abs(o - want_o))
    naive_error = np.max(np.abs(naive_bf16(qd, kd, vd, causal, 1 / np.sqrt(d)).get() - want_o))
    assert not np.isnan(o).any(), f"NaN in O (seed {seed})"
    assert error <= 2 * naive_error, f"bf16 O error {error:.2e} > 2 × naive bf16's {naive_error:.2e} (seed {seed})"
    # S and l_i are float32 from bf16 inputs: lse is the float64 lse of the rounded inputs, nearly exactly
    rounded = [round_bf16(x) for x in (q, k, v)]
    _, want_lse = flash_attention(*(x.astype(np.float64) for x in rounded), causal=causal, return_lse=True)
    assert_close(lse.get(), want_lse, seed, "bf16 lse")


def test_bfloat16_bits_and_float32_inputs_give_the_same_result(fresh):
    rng, seed = fresh
    cp = cupy()
    q, k, v = (cp.asarray(x) for x in inputs(rng, 70, 90, 64, 4, 2)[:3])
    from_float32 = gpu.forward_bf16(q, k, v, causal=True)
    from_bits = gpu.forward_bf16(*(gpu.to_bfloat16(x) for x in (q, k, v)), causal=True)
    for a, b in zip(from_float32, from_bits):
        cp.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("h, h_kv", HEADS)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("n_q, n_k", SIZES)
def test_bfloat16_gradients_are_within_twice_those_of_naive_bfloat16_attention(n_q, n_k, d, h, h_kv, causal, fresh):
    """Each of dQ, dK, dV: max error against float64 at most twice naive bf16's, plus float32's tolerance
    (where the exact gradient is 0, as dQ is with one key, naive bf16 can be exactly right by luck)."""
    rng, seed = fresh
    cp = cupy()
    q, k, v, do = inputs(rng, n_q, n_k, d, h, h_kv)
    _, _, want_grads = reference(q, k, v, do, causal)
    qd, kd, vd, dod = (cp.asarray(x) for x in (q, k, v, do))
    o, lse = gpu.forward_bf16(qd, kd, vd, causal=causal)
    grads = poisoned(q.shape, k.shape, v.shape)
    gpu.backward_bf16(qd, kd, vd, o, lse, dod, causal=causal, out=grads)
    naive = naive_bf16_gradients(qd, kd, vd, dod, causal, 1 / np.sqrt(d))
    for name, got, naive_grad, want in zip(("dQ", "dK", "dV"), grads, naive, want_grads):
        got = got.get()
        assert not np.isnan(got).any(), f"NaN in bf16 {name} (seed {seed})"
        error = np.max(np.abs(got - want), initial=0)
        naive_error = np.max(np.abs(naive_grad.get() - want), initial=0)
        allowed = 2 * naive_error + FLOAT32_TOLERANCE * max(1.0, np.max(np.abs(want), initial=0))
        assert error <= allowed, f"bf16 {name} error {error:.2e} > 2 × naive bf16's {naive_error:.2e} (seed {seed})"


def run_bfloat16(q, k, v, do, causal):
    """forward_bf16 then backward_bf16 on the host arrays: (o, lse, [dq, dk, dv]) on the host."""
    cp = cupy()
    qd, kd, vd, dod = (cp.asarray(x) for x in (q, k, v, do))
    o, lse = gpu.forward_bf16(qd, kd, vd, causal=causal)
    grads = gpu.backward_bf16(qd, kd, vd, o, lse, dod, causal=causal)
    return o.get(), lse.get(), [g.get() for g in grads]


def test_bfloat16_fully_masked_rows_and_padding_give_zero_gradients(fresh):
    rng, seed = fresh
    q, k, v, do = inputs(rng, 100, 30, 17, 4, 2)  # bottom-right: rows 0..69 see no key; d = 17 is padded
    _, _, (dq, dk, dv) = run_bfloat16(q, k, v, do, "bottom_right")
    assert not any(np.isnan(x).any() for x in (dq, dk, dv)), f"NaN (seed {seed})"
    np.testing.assert_array_equal(dq[..., :70, :], 0)
    assert np.abs(dq[..., 70:, :]).max() > 0 and np.abs(dk).max() > 0 and np.abs(dv).max() > 0


def test_bfloat16_gradients_are_the_same_bits_on_every_run(fresh):
    rng, seed = fresh
    q, k, v, do = inputs(rng, 300, 300, 64, 8, 1)  # MQA: dK, dV summed over 8 heads, in a fixed order
    first, second = run_bfloat16(q, k, v, do, True), run_bfloat16(q, k, v, do, True)
    for a, b in zip(first[2], second[2]):
        np.testing.assert_array_equal(a, b)


def test_bfloat16_backward_takes_bits_or_float32_alike(fresh):
    rng, seed = fresh
    cp = cupy()
    q, k, v, do = (cp.asarray(x) for x in inputs(rng, 70, 90, 64, 4, 2))
    o, lse = gpu.forward_bf16(q, k, v, causal=True)
    from_float32 = gpu.backward_bf16(q, k, v, o, lse, do, causal=True)
    from_bits = gpu.backward_bf16(*(gpu.to_bfloat16(x) for x in (q, k, v)), o, lse, gpu.to_bfloat16(do), causal=True)
    for a, b in zip(from_float32, from_bits):
        cp.testing.assert_array_equal(a, b)
