"""ZeRO's stages 1-3 over real MPI ranks (mpiexec -n 2 and -n 4): each rank's bytes by category, to the
byte, against the paper's formulas, and the weights after k Adam steps against one process's."""
from types import SimpleNamespace

import pytest

from ag import memory_model
from ag.parallel import zero
from test_parallel import run_ranks

STEPS, LR = 5, 1e-2  # --check's Adam runs at lr 1e-2


def run_zero(n: int, *args: str) -> dict:
    return run_ranks(n, *args, module="ag.parallel.zero")


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_each_rank_holds_exactly_zeros_bytes_for_every_stage(ranks):
    result = run_zero(ranks)
    assert result["ranks"] == ranks and [r["stage"] for r in result["rows"]] == [0, 1, 2, 3]
    for row in result["rows"]:
        assert row["measured"] == [row["formula"]] * ranks, row


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_the_measured_bytes_follow_the_float32_analogues_of_the_papers_formulas(ranks):
    """4Ψ + 4Ψ + 8Ψ/N_d, 4Ψ + 12Ψ/N_d, 16Ψ/N_d: float32 Adam's 4 + 4 + 8 bytes a parameter."""
    rows = {r["stage"]: r for r in run_zero(ranks, "--stages", "1", "2", "3")["rows"]}
    psi = rows[1]["psi"]
    assert psi == 4 * 64 * 64
    totals = {stage: sum(row["measured"][0].values()) for stage, row in rows.items()}
    assert totals == {1: 8 * psi + 8 * psi // ranks, 2: 4 * psi + 12 * psi // ranks, 3: 16 * psi // ranks}


@pytest.mark.slow
def test_on_two_ranks_every_stage_ends_bit_identical_to_one_process():
    """Two grads add the same in either order, so the sum is the one process's g_0 + g_1 exactly."""
    for row in run_zero(2, "--check", str(STEPS))["rows"]:
        assert row["identical"] and row["max_abs_difference"] == 0.0, row
        assert row["losses"][-1] < row["losses"][0]


@pytest.mark.slow
def test_on_four_ranks_the_stages_agree_with_one_process_within_float32_rounding():
    """MPICH's reduce-scatter adds four grads in another order than g_0 + g_1 + g_2 + g_3, so a grad may
    differ in its last bits; Adam's step is at most lr in size, and stays within 1e-4 of it per step here.
    Stages 1-3 all reduce-scatter, so they agree with each other to the bit."""
    rows = run_zero(4, "--check", str(STEPS))["rows"]
    for row in rows:
        assert row["max_abs_difference"] <= STEPS * LR * 1e-4, row
    assert rows[1]["losses"] == rows[2]["losses"] == rows[3]["losses"]


@pytest.mark.slow
@pytest.mark.parametrize("ranks, precision", [(2, "float16"), (2, "bfloat16"), (4, "float16")])
def test_with_mixed_precision_each_rank_holds_the_papers_bytes_measured(ranks, precision):
    """ZeRO's Figure 1 by category: 16-bit weights and grads, float32 master shard plus Adam's m and v:
    2Ψ + 2Ψ + 12Ψ, 4Ψ + 12Ψ/N_d, 2Ψ + 14Ψ/N_d, 16Ψ/N_d, each rank's tracemalloc count to the byte."""
    if precision == "bfloat16":
        pytest.importorskip("ml_dtypes")
    result = run_zero(ranks, "--precision", precision)
    assert result["precision"] == precision
    rows = {r["stage"]: r for r in result["rows"]}
    psi = rows[0]["psi"]
    for stage, row in rows.items():
        want = memory_model.zero_bytes_per_rank(psi, ranks, stage)  # mixed precision's 2 + 2 + 12 by default
        assert row["measured"] == [want] * ranks, row
    totals = {stage: sum(row["measured"][0].values()) for stage, row in rows.items()}
    assert totals == {0: 16 * psi, 1: 4 * psi + 12 * psi // ranks, 2: 2 * psi + 14 * psi // ranks, 3: 16 * psi // ranks}


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_with_mixed_precision_two_ranks_end_bit_identical_to_one_process(precision):
    """MPI sums 16-bit grads in float32 and rounds back, as the one-process reference does; two addends
    add the same in either order, and the master copies step elementwise, shard or whole."""
    if precision == "bfloat16":
        pytest.importorskip("ml_dtypes")
    for row in run_zero(2, "--check", str(STEPS), "--precision", precision)["rows"]:
        assert row["identical"] and row["max_abs_difference"] == 0.0, row
        assert row["losses"][-1] < row["losses"][0]


def test_an_unknown_precision_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"precision='int8'; expected one of \('float32', 'float16', 'bfloat16'\)"):
        zero.dtype_of("int8")


def test_a_zero_stage_on_one_rank_is_refused():
    with pytest.raises(ValueError, match=r"ZeRO stage 2 on 1 rank.*expected mpiexec -n N with N >= 2"):
        zero.build(SimpleNamespace(size=1, rank=0), 2, 1, 8)


def test_a_stage_outside_0_to_3_is_refused():
    with pytest.raises(ValueError, match=r"stage=4; expected one of \(0, 1, 2, 3\)"):
        zero.check_stage(2, 4, 8)


def test_a_weight_that_does_not_split_evenly_is_refused():
    with pytest.raises(ValueError, match=r"3x3 = 9 values does not split into 2 equal shards"):
        zero.check_stage(2, 1, 3)


@pytest.mark.parametrize("stage, want", [(0, (16, 16, 96)), (1, (16, 16, 24)), (2, (16, 4, 24)), (3, (4, 4, 24))])
def test_memory_model_gives_the_papers_mixed_precision_bytes(stage, want):
    """Ψ = 8, N_d = 4: 16Ψ = 128, 4Ψ + 12Ψ/N_d = 56, 2Ψ + 14Ψ/N_d = 44, 16Ψ/N_d = 32."""
    got = memory_model.zero_bytes_per_rank(8, 4, stage)
    assert (got["params"], got["grads"], got["optimizer_state"]) == want
    assert sum(got.values()) == {0: 128, 1: 56, 2: 44, 3: 32}[stage]


def test_memory_model_refuses_parameters_that_do_not_split_over_the_ranks():
    with pytest.raises(ValueError, match=r"psi=10 parameters cannot be split over n_d=4 ranks"):
        memory_model.zero_bytes_per_rank(10, 4, 1)
