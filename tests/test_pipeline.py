"""GPipe and 1F1B over real MPI ranks (mpiexec -n 2 and -n 4): activations held per stage, measured with
tracemalloc, and the bubble counted in the slots of the executed schedule and timed in seconds."""
from fractions import Fraction

import pytest

from ag import memory_model
from ag.parallel import pipeline
from test_parallel import run_ranks


WORK_MS = 50  # each slot of work also sleeps 50 ms: the schedule, not messages or load, sets the seconds


def run_pipeline(n: int, *args: str) -> dict:
    return run_ranks(n, "--hidden", "32", "--rows", "8", *args, module="ag.parallel.pipeline")


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"p{p}")
def rows(request):
    return request.param, run_pipeline(request.param, "--micro-batches", "4", "8", "--work-ms", str(WORK_MS))["rows"]


@pytest.mark.slow
def test_gpipe_holds_all_m_micro_batches_on_every_stage(rows):
    p, found = rows
    for row in (r for r in found if r["schedule"] == "gpipe"):
        for stage in row["stages"]:
            assert stage["peak_bytes"] == row["m"] * stage["one_micro_batch"] > 0, (row["m"], stage)


@pytest.mark.slow
def test_1f1b_holds_at_most_p_micro_batches_stage_s_holding_p_minus_s(rows):
    p, found = rows
    for row in (r for r in found if r["schedule"] == "1f1b"):
        for stage in row["stages"]:
            assert stage["peak_bytes"] == (p - stage["stage"]) * stage["one_micro_batch"], (row["m"], stage)
            assert stage["peak_bytes"] <= p * stage["one_micro_batch"]


@pytest.mark.slow
def test_the_bubble_in_slots_is_p_minus_1_over_m_plus_p_minus_1_for_both_schedules(rows):
    p, found = rows
    assert {(r["schedule"], r["m"]) for r in found} == {(s, m) for s in ("gpipe", "1f1b") for m in (4, 8)}
    for row in found:
        want = Fraction(p - 1, row["m"] + p - 1)
        for stage in row["stages"]:
            assert stage["bubble_slots"] == pytest.approx(float(want), abs=1e-12), (row["schedule"], stage)


@pytest.mark.slow
def test_the_bubble_in_seconds_is_p_minus_1_over_m_plus_p_minus_1_for_both_schedules(rows):
    """Idle seconds over wall seconds, per stage. Messages and Python only add idle time, a few ms against
    (m + p − 1) · 3 · 50 ms, so the band is 2 points below the formula to 6 above: m = 4's 0.2 and m = 8's
    0.111 on 2 stages lie outside each other's band, as does 0.5, two stages that never overlap."""
    p, found = rows
    for row in found:
        want = float(Fraction(p - 1, row["m"] + p - 1))
        for stage in row["stages"]:
            assert want - 0.02 <= stage["bubble_seconds"] <= want + 0.06, (row["schedule"], row["m"], stage)


def test_fewer_micro_batches_than_stages_is_refused():
    with pytest.raises(ValueError, match=r"m=2 micro-batches for p=4 stages; expected m >= p"):
        pipeline.one_f_one_b(4, 2, 0)
    with pytest.raises(ValueError, match=r"m=3 micro-batches for p=4 stages; expected m >= p"):
        pipeline.gpipe(4, 3, 1)


def test_1f1b_warms_up_with_p_minus_s_minus_1_forwards_then_alternates():
    assert pipeline.one_f_one_b(3, 4, 0) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1),
                                            ("B", 2), ("B", 3)]
    assert pipeline.one_f_one_b(3, 4, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2),
                                            ("F", 3), ("B", 3)]


def test_every_schedule_runs_each_forward_before_its_backward_once():
    for name in pipeline.SCHEDULES:
        for stage in range(4):
            actions = pipeline.schedule(name, 4, 6, stage)
            assert sorted(actions) == sorted([("F", j) for j in range(6)] + [("B", j) for j in range(6)])
            assert all(actions.index(("F", j)) < actions.index(("B", j)) for j in range(6))


def test_memory_model_states_the_bubble_and_the_micro_batches_in_flight():
    assert memory_model.pipeline_bubble(4, 8) == Fraction(3, 11)
    assert [memory_model.micro_batches_in_flight("1f1b", 4, 8, s) for s in range(4)] == [4, 3, 2, 1]
    assert memory_model.micro_batches_in_flight("gpipe", 4, 8, 3) == 8
    with pytest.raises(ValueError, match=r"schedule='zb'; expected 'gpipe' or '1f1b'"):
        memory_model.micro_batches_in_flight("zb", 4, 8, 0)
