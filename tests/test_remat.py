"""Rematerialization: the lecture's rematerializer code and ag.remat.sequential."""
import numpy as np
import pytest

import ag
from ag import remat

N_LAYERS, BATCH, WIDTH = 10, 6, 5


@pytest.fixture
def weights(rng):
    return [ag.Tensor(rng.standard_normal((WIDTH, WIDTH)) / 2, requires_grad=True, name=f"w{i}")
            for i in range(N_LAYERS)]


@pytest.fixture
def x_value(rng):
    return rng.standard_normal((BATCH, WIDTH))


def lecture_forward(weights, x_value, checkpoints, wrong_slice=False, input_grad=False):
    """The slide's code: x = matmul(x, w) in a loop, a _rematerializer from the farthest checkpoint.

    ``checkpoints`` are layer indices whose outputs are kept; the input is always kept.
    The slide's slice ``weights[farthest_checkpoint:(i+1)]`` re-applies the checkpoint
    layer's own weight; the right slice starts one past it.
    """
    x = ag.Tensor(x_value, requires_grad=input_grad)
    outputs = []
    for i, w in enumerate(weights):
        x = ag.matmul(x, w)
        outputs.append(x)
        if i not in checkpoints:
            def _rematerializer(i=i):
                farthest_checkpoint = max([c for c in checkpoints if c < i], default=-1)
                y = x_value if farthest_checkpoint < 0 else outputs[farthest_checkpoint].value
                first = farthest_checkpoint if wrong_slice else farthest_checkpoint + 1
                for w in weights[max(first, 0):(i + 1)]:
                    y = ag.matmul(y, w.value).value
                return y
            x.rematerializer = _rematerializer
    return ag.sum(x), outputs


def grads(weights):
    return [w.grad.copy() for w in weights]


def test_lecture_rematerializer_gives_gradients_identical_to_no_rematerialization(weights, x_value):
    loss, _ = lecture_forward(weights, x_value, checkpoints=list(range(N_LAYERS)))
    loss.backward()
    expected = grads(weights)
    for w in weights:
        w.zero_grad()
    loss, outputs = lecture_forward(weights, x_value, checkpoints=[5])
    assert [o.value is None for o in outputs] == [i != 5 for i in range(N_LAYERS)]
    loss.backward()
    for got, want in zip(grads(weights), expected):
        np.testing.assert_array_equal(got, want)


def test_the_slides_slice_that_reapplies_the_checkpoint_weight_gives_wrong_gradients(weights, x_value):
    loss, _ = lecture_forward(weights, x_value, checkpoints=list(range(N_LAYERS)))
    loss.backward()
    expected = grads(weights)
    for w in weights:
        w.zero_grad()
    loss, _ = lecture_forward(weights, x_value, checkpoints=[5], wrong_slice=True)
    loss.backward()
    wrong = [not np.allclose(got, want) for got, want in zip(grads(weights), expected)]
    assert any(wrong)
    assert wrong[7:] == [True, True, True]  # layers after the checkpoint read a wrong input


def test_lecture_example_counts_30_matmuls_without_and_75_recomputing_all_from_the_input(weights, x_value):
    with ag.count_ops() as plain:
        lecture_forward(weights, x_value, list(range(N_LAYERS)), input_grad=True)[0].backward()
    with ag.count_ops() as from_input:
        lecture_forward(weights, x_value, [], input_grad=True)[0].backward()
    assert plain.total_matmuls == 30
    assert from_input.total_matmuls == 75
    assert from_input.matmuls["recompute"] == 45  # x_i for i = 0..8 costs i + 1 products


def test_ag_saves_one_product_when_the_input_needs_no_grad(weights, x_value):
    with ag.count_ops() as plain:
        lecture_forward(weights, x_value, list(range(N_LAYERS)))[0].backward()
    with ag.count_ops() as from_input:
        lecture_forward(weights, x_value, [])[0].backward()
    assert (plain.total_matmuls, from_input.total_matmuls) == (29, 74)


def _layers(weights):
    return [lambda h, w=w: ag.tanh(h @ w) for w in weights]


@pytest.mark.parametrize("mode", ["segment", "tensor"])
@pytest.mark.parametrize("checkpoints", [[], [5], [0, 3, 6, 9], [2, 5, 8], list(range(N_LAYERS))])
def test_sequential_gradients_are_bit_identical_to_no_rematerialization(weights, x_value, checkpoints, mode):
    x = ag.Tensor(x_value, requires_grad=True)
    ag.sum(remat.sequential(_layers(weights), x, list(range(N_LAYERS)))).backward()
    expected = grads(weights) + [x.grad.copy()]
    for t in [*weights, x]:
        t.zero_grad()
    ag.sum(remat.sequential(_layers(weights), x, checkpoints, mode=mode)).backward()
    for got, want in zip(grads(weights) + [x.grad], expected):
        np.testing.assert_array_equal(got, want)


def test_after_sequential_forward_exactly_the_non_checkpoint_outputs_are_discarded(weights, x_value):
    outputs = []
    layers = [lambda h, f=f: outputs.append(f(h)) or outputs[-1] for f in _layers(weights)]
    out = remat.sequential(layers, ag.Tensor(x_value), [2, 5])
    ag.sum(out)  # the last output is consumed too
    assert [o.value is None for o in outputs] == [i not in (2, 5) for i in range(N_LAYERS)]


def test_segment_mode_recomputes_each_run_once_and_tensor_mode_each_value_from_its_checkpoint(weights, x_value):
    layers = [lambda h, w=w: h @ w for w in weights]
    x = ag.Tensor(x_value)
    with ag.count_ops() as segment:
        ag.sum(remat.sequential(layers, x, [4], mode="segment")).backward()
    with ag.count_ops() as tensor:
        ag.sum(remat.sequential(layers, x, [4], mode="tensor")).backward()
    # backward needs x_0..x_8; x_4 is kept. Segment: layers 0-3 once, 5-8 once.
    assert segment.matmuls["recompute"] == 4 + 4
    # tensor: x_i costs i+1 products before the checkpoint and i-4 after it
    assert tensor.matmuls["recompute"] == (1 + 2 + 3 + 4) + (1 + 2 + 3 + 4)


def test_sequential_refuses_a_checkpoint_that_is_not_a_layer(weights, x_value):
    with pytest.raises(ValueError, match=r"checkpoint 10 is not a layer index in 0..9"):
        remat.sequential(_layers(weights), ag.Tensor(x_value), [10])


def test_a_layer_that_replays_differently_is_reported(weights, x_value):
    calls = []

    def moody(h):
        calls.append(1)
        return ag.tanh(h) if len(calls) == 1 else ag.exp(ag.tanh(h))
    loss = ag.sum(remat.sequential([moody, _layers(weights)[0]], ag.Tensor(x_value, requires_grad=True), []))
    with pytest.raises(ag.GraphError, match="replay of layer 0 made 2 tensors where the forward made 1"):
        loss.backward()
