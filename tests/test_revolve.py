"""Revolve (binomial checkpointing): closed form, dynamic program, schedules and their checker."""
import itertools
from collections import deque

import pytest

from ag.remat.graphs.revolve import (Revolve, binomial_forwards, check_actions, dp_forwards, one_level_forwards,
                                     revolve)

MAX_LAYERS, MAX_SLOTS = 100, 8
GRID = [(n, s) for n in range(1, MAX_LAYERS + 1) for s in range(MAX_SLOTS + 1)]


@pytest.fixture(scope="module")
def schedules():
    return {(n, s): revolve(n, s) for n, s in GRID}


def fewest_forwards_by_search(n: int, slots: int) -> int:
    """Fewest forwards over every action sequence of the model: 0-1 BFS on (stored, working, next, reached)."""
    start = (frozenset(), 0, n, 0)
    best = {start: 0}
    queue = deque([(0, start)])
    while queue:
        cost, state = queue.popleft()
        if cost > best[state]:
            continue
        stored, working, next_backward, reached = state
        if next_backward == 0:
            return cost
        available = {0, working} | stored
        moves = [(1, (stored, j + 1, next_backward, max(reached, j + 1))) for j in available if j < n]
        if 1 <= working < n and working not in stored and len(stored) < slots:
            moves.append((0, (stored | {working}, working, next_backward, reached)))
        moves += [(0, (stored - {j}, working, next_backward, reached)) for j in stored]
        if reached == n and next_backward - 1 in available:
            moves.append((0, (stored, working, next_backward - 1, reached)))
        for step_cost, nxt in moves:
            if cost + step_cost < best.get(nxt, float("inf")):
                best[nxt] = cost + step_cost
                (queue.appendleft if step_cost == 0 else queue.append)((cost + step_cost, nxt))
    raise AssertionError(f"no schedule reverses {n} layers with {slots} slots")


def one_level_actions(n: int, kept: tuple[int, ...]) -> list[tuple[str, int]]:
    """Store ``kept`` in the first sweep; each backward i recomputes x_{i-1} from the nearest kept state below."""
    actions = []
    for i in range(1, n + 1):
        actions.append(("forward", i))
        if i in kept:
            actions.append(("store", i))
    for i in range(n, 0, -1):
        a = max([k for k in kept if k <= i - 1], default=0)
        actions += [("forward", j) for j in range(a + 1, i)]
        actions.append(("backward", i))
        if a == i - 1 and a > 0:
            actions.append(("free", a))
    return actions


def forward_count(actions) -> int:
    return sum(1 for kind, _ in actions if kind == "forward")


def test_forwards_match_closed_form_and_dp_up_to_100_layers_and_8_slots():
    mismatches = [(n, s, binomial_forwards(n, s), dp_forwards(n, s)) for n, s in GRID
                  if binomial_forwards(n, s) != dp_forwards(n, s)]
    assert not mismatches, f"(n, slots, closed form, dp): {mismatches[:5]}"


def test_dp_matches_exhaustive_search_over_all_action_sequences_up_to_7_layers():
    for n in range(1, 8):
        for s in range(n + 1):
            assert dp_forwards(n, s) == fewest_forwards_by_search(n, s), (n, s)


@pytest.mark.parametrize("n, slots, expected", [
    (1, 0, 1),      # forward 1, backward 1 reads x_0
    (2, 0, 3),      # 1 2 | 1 b2 b1
    (2, 1, 2),      # store x_1: nothing recomputed
    (3, 1, 4),      # 1 2 [x_2] 3 b3 | 1 b2 b1
    (4, 0, 10),     # 4 + 3 + 2 + 1
    (4, 3, 4),      # every x_1..x_3 stored
    (4, 9, 4),      # more slots than states
    (5, 1, 8),      # 1 2 3 [x_3] 4 5 | 4 b5 b4 | 1 [x_1] 2 b3 b2 b1
])
def test_forwards_of_small_chains_worked_by_hand(n, slots, expected):
    assert binomial_forwards(n, slots) == expected
    assert dp_forwards(n, slots) == expected
    assert revolve(n, slots).forwards == expected


def test_revolve_for_three_layers_and_one_slot_is_the_hand_worked_schedule():
    assert revolve(3, 1).actions == (
        ("forward", 1), ("forward", 2), ("store", 2), ("forward", 3), ("backward", 3), ("free", 2),
        ("forward", 1), ("backward", 2), ("backward", 1))


def test_revolve_actions_pass_check_actions_up_to_100_layers_and_8_slots(schedules):
    for (n, s), schedule in schedules.items():
        check_actions(n, s, schedule.actions)


def test_revolve_forward_count_equals_closed_form_up_to_100_layers_and_8_slots(schedules):
    wrong = [(n, s, sch.forwards, binomial_forwards(n, s)) for (n, s), sch in schedules.items()
             if sch.forwards != binomial_forwards(n, s)]
    assert not wrong, f"(n, slots, revolve, closed form): {wrong[:5]}"


def test_revolve_peak_slots_never_exceed_slots(schedules):
    over = [(n, s, sch.peak_slots()) for (n, s), sch in schedules.items() if sch.peak_slots() > s]
    assert not over, f"(n, slots, peak): {over[:5]}"


def test_revolve_frees_every_slot_it_stores(schedules):
    for schedule in schedules.values():
        kinds = [kind for kind, _ in schedule.actions]
        assert kinds.count("store") == kinds.count("free")


def test_recomputed_is_forwards_minus_layers_and_zero_with_a_slot_per_state():
    assert revolve(10, 2).recomputed == binomial_forwards(10, 2) - 10
    assert revolve(10, 9).recomputed == 0
    assert revolve(10, 0).recomputed == 10 * 9 // 2


def test_revolve_of_1200_layers_without_slots_does_not_recurse_per_layer():
    assert revolve(1200, 0).forwards == 1200 + 1200 * 1199 // 2


def test_revolve_is_a_frozen_record_of_its_arguments():
    schedule = revolve(6, 2)
    assert isinstance(schedule, Revolve) and (schedule.n_layers, schedule.slots) == (6, 2)
    with pytest.raises(AttributeError):
        schedule.slots = 3


def test_check_actions_accepts_a_hand_written_schedule():
    check_actions(3, 0, [("forward", 1), ("forward", 2), ("forward", 3), ("forward", 1), ("forward", 2),
                         ("backward", 3), ("forward", 1), ("backward", 2), ("backward", 1)])


@pytest.mark.parametrize("n, slots, actions, message", [
    (3, 0, [("forward", 1), ("forward", 2), ("forward", 3), ("backward", 3)],
     r"\('backward', 3\) needs x_2, which is neither stored"),
    (3, 1, [("forward", 1), ("store", 1), ("forward", 2), ("store", 2)],
     r"\('store', 2\) needs a slot, but all 1 hold \[1\]"),
    (3, 2, [("forward", 1), ("store", 1), ("forward", 2), ("store", 2), ("forward", 3), ("backward", 2)],
     r"\('backward', 2\) is out of order: backward 3 is next"),
    (3, 1, [("forward", 1), ("free", 1)], r"\('free', 1\) frees x_1, which is not stored"),
    (2, 1, [("forward", 1), ("backward", 2)], r"before the first sweep computed x_2 \(it reached x_1\)"),
    (3, 1, [("forward", 2)], r"needs x_1, which has not been computed yet"),
    (3, 1, [("forward", 1), ("forward", 2), ("store", 1)], r"stores x_1, but the working state is x_2"),
    (2, 0, [("forward", 1), ("forward", 2), ("forward", 1), ("backward", 2)],
     r"the actions end before backward 1; backwards must run from 2 down to 1"),
    (2, 0, [("forward", 3)], r"\('forward', 3\) has index 3 outside 1\.\.2"),
    (2, 1, [("store", 2)], r"has index 2 outside 1\.\.1"),
    (2, 0, [("jump", 1)], r"action 0 \('jump', 1\) is not \(kind, index\)"),
])
def test_check_actions_rejects_broken_schedules_naming_the_action(n, slots, actions, message):
    with pytest.raises(ValueError, match=message):
        check_actions(n, slots, actions)


def test_check_actions_rejects_revolve_schedules_missing_one_recompute(rng, schedules):
    cases = [(n, s) for n, s in GRID if schedules[n, s].recomputed > 0]
    for index in rng.choice(len(cases), size=50, replace=False):
        n, s = cases[index]
        actions = list(schedules[n, s].actions)
        first_sweep_end = actions.index(("forward", n))
        recomputes = [k for k, (kind, _) in enumerate(actions) if kind == "forward" and k > first_sweep_end]
        del actions[recomputes[rng.integers(len(recomputes))]]
        with pytest.raises(ValueError, match="needs x_|stores x_"):
            check_actions(n, s, actions)


def test_one_level_never_beats_revolve_up_to_100_layers_and_8_slots():
    worse = [(n, s) for n, s in GRID if one_level_forwards(n, s) < binomial_forwards(n, s)]
    assert not worse


@pytest.mark.parametrize("slots", [1, 2, 3, 4])
def test_revolve_recomputes_strictly_less_than_one_level_at_30_layers_and_few_slots(slots):
    assert one_level_forwards(30, slots) > binomial_forwards(30, slots)


def test_one_level_and_revolve_agree_without_slots_and_with_a_slot_per_state():
    assert one_level_forwards(30, 0) == binomial_forwards(30, 0) == 30 + 30 * 29 // 2
    assert one_level_forwards(30, 29) == binomial_forwards(30, 29) == 30


def test_one_level_forwards_is_the_best_of_every_kept_set_replayed_by_check_actions():
    for n in range(1, 9):
        for s in range(4):
            counts = []
            for k in range(min(s, n - 1) + 1):
                for kept in itertools.combinations(range(1, n), k):
                    actions = one_level_actions(n, kept)
                    check_actions(n, s, actions)
                    counts.append(forward_count(actions))
            assert one_level_forwards(n, s) == min(counts), (n, s)


FUNCTIONS = {"revolve": revolve, "binomial_forwards": binomial_forwards, "dp_forwards": dp_forwards,
             "one_level_forwards": one_level_forwards,
             "check_actions": lambda n, s: check_actions(n, s, [])}


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("n_layers", [0, -3, 2.5, True, "4", None])
def test_bad_n_layers_raise_value_error_naming_the_function_and_value(name, n_layers):
    with pytest.raises(ValueError, match=rf"^{name}: n_layers must be an integer >= 1") as error:
        FUNCTIONS[name](n_layers, 2)
    assert repr(n_layers) in str(error.value)


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("slots", [-1, 1.0, False, "2"])
def test_bad_slots_raise_value_error_naming_the_function_and_value(name, slots):
    with pytest.raises(ValueError, match=rf"^{name}: slots must be an integer >= 0") as error:
        FUNCTIONS[name](4, slots)
    assert repr(slots) in str(error.value)
