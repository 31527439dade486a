"""ag.wall: one training step of a GPT-like model by slice, each slice equal to its formula to the
byte, the levers that cut them, and ``ag demo wall``."""
from dataclasses import replace

import numpy as np
import pytest

import ag
from ag import demo, wall
from ag.parallel.mpi import StandIn

TINY = wall.WallConfig(num_layers=1, hidden=32, heads=2, seq=32, batch=2, vocab=16)
SETTINGS = {
    "float32": TINY,
    "mixed precision": replace(TINY, dtype="float16"),
    "mixed precision, selective": replace(TINY, dtype="float16", granularity="selective"),
    "float32, full recomputation": replace(TINY, granularity="full", num_layers=2),
    "mixed precision, flash": replace(TINY, dtype="float16", attention="flash"),
}


@pytest.mark.parametrize("name", SETTINGS)
def test_every_slice_of_a_training_step_equals_its_formula_to_the_byte(name):
    measured, peak = wall.measure(SETTINGS[name])
    assert measured == wall.predict(SETTINGS[name])
    assert peak >= sum(measured.values()) - measured["gradients"]  # the slices that coexist at the forward's end


def test_float32_adam_is_16_bytes_a_parameter_and_mixed_precision_too_with_half_the_activations():
    psi = wall.parameter_count(TINY)
    full, _ = wall.measure(TINY)
    mixed, _ = wall.measure(replace(TINY, dtype="float16"))
    assert (full["parameters"], full["gradients"], full["optimizer state"]) == (4 * psi, 4 * psi, 8 * psi)
    assert (mixed["parameters"], mixed["gradients"], mixed["optimizer state"]) == (2 * psi, 2 * psi, 12 * psi)
    masks = 2 * TINY.seq * TINY.batch * TINY.hidden + TINY.heads * TINY.seq ** 2 * TINY.batch  # 1 byte either way
    assert full["activations"] - masks == 2 * (mixed["activations"] - masks)


def test_the_parameter_count_is_the_models():
    model = wall._GPT(TINY, np.float32, 0)
    assert sum(p.size for p in model.parameters()) == wall.parameter_count(TINY)


def test_activations_overtake_parameters_and_optimizer_state_as_the_batch_grows():
    small = wall.predict(replace(TINY, batch=1))
    large = wall.predict(replace(TINY, batch=16))
    assert small["activations"] < small["parameters"] + small["optimizer state"]
    assert large["activations"] > large["parameters"] + large["gradients"] + large["optimizer state"]


def test_each_lever_is_added_on_top_of_the_ones_before_and_a_new_one_plugs_in():
    doubled = wall.Lever("twice the batch", lambda c: replace(c, batch=2 * c.batch))
    bars = wall.wall(sizes=((1, 32, 2),), batches=(1,), seq=16, levers=("mixed precision", doubled))
    assert [bar.levers for bar in bars] == [(), ("mixed precision",), ("mixed precision", "twice the batch")]
    assert bars[2].config == replace(bars[0].config, dtype="float16", batch=2)
    assert all(bar.measured == bar.predicted for bar in bars)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_each_zero_stage_cuts_rank_0s_model_states_to_the_papers_formula_measured(stage):
    """Mixed precision on rank 0 of N_d = 2: 4Ψ + 12Ψ/N_d, 2Ψ + 14Ψ/N_d, 16Ψ/N_d, the activations untouched."""
    mixed = replace(TINY, dtype="float16")
    config = wall.LEVERS[f"ZeRO-{stage}"].apply(mixed)
    measured, _ = wall.measure(config)
    before, _ = wall.measure(mixed)
    psi = wall.parameter_count(TINY)
    states = measured["parameters"] + measured["gradients"] + measured["optimizer state"]
    assert states == {1: 4 * psi + 6 * psi, 2: 2 * psi + 7 * psi, 3: 8 * psi}[stage]
    assert measured == wall.predict(config) and measured["activations"] == before["activations"]


def test_offloading_full_recomputations_checkpoints_leaves_only_the_output_and_the_loss():
    config = wall.LEVERS["offloading"].apply(replace(TINY, num_layers=2))
    full, _ = wall.measure(replace(config, offload=False))
    measured, _ = wall.measure(config)
    sbh = TINY.seq * TINY.batch * TINY.hidden
    assert measured["activations"] == (sbh + 1) * 4 and full["activations"] == (3 * sbh + 1) * 4
    assert measured == wall.predict(config)


def test_the_stand_in_rank_allocates_what_mpi_would():
    group = StandIn(4, rank=1)
    x = np.arange(8, dtype=np.float16)
    piece = group.reduce_scatter(x)
    assert piece.dtype == np.float16 and np.array_equal(piece, x[2:4])
    assert group.all_gather(piece).shape == (8,) and group.all_reduce(x).dtype == np.float16
    with pytest.raises(ValueError, match=r"rank=4 of size=4; expected 0 <= rank < size"):
        StandIn(4, rank=4)


def test_an_unknown_lever_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown lever 'zero'; expected one of \['ZeRO-1', 'ZeRO-2', 'ZeRO-3', 'flash attention', "):
        wall.wall(sizes=((1, 32, 2),), batches=(1,), levers=("zero",))


def test_the_wall_demo_prints_every_bar_beside_its_formula_and_draws_it(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    bars = demo.wall_demo(str(tmp_path), sizes=((1, 32, 2), (1, 64, 2)), batches=(1, 2), seq=16)
    out = capsys.readouterr().out
    assert len(bars) == 8 and "8 of 8 bars equal their formula to the byte" in out
    assert "L=1 h=64 s=16 b=2 +mixed precision" in out
    assert (tmp_path / "memory_wall.png").stat().st_size > 10_000
    assert "9 of 9 bars equal their formula to the byte" in out  # the levers, one on top of another
    for lever in demo.LADDER:
        assert f"\n{lever} " in out
    assert (tmp_path / "memory_wall_levers.png").stat().st_size > 10_000
    assert ag.wall.SLICES == ("parameters", "gradients", "optimizer state", "activations")
