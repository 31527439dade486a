"""Revolve: binomial checkpointing (Griewank and Walther, "Algorithm 799: revolve", ACM TOMS 2000).

Revolve reverses a chain x_0 -> x_1 -> ... -> x_n, x_i = F_i(x_{i-1}), with a fixed number of
checkpoint slots and the fewest forward steps that many slots allow. It is multi-level: a slot
freed when its segment is done is taken again inside the next segment, so checkpoints move as
the reversal proceeds.

The model (every function here uses it):

- x_0, the input, is always available and takes no slot; ``slots`` of x_1..x_{n-1} may be
  stored at once. The *working state* is the value the last forward computed.
- ``("forward", i)`` computes x_i from x_{i-1} (x_0, stored, or the working state); x_i becomes
  the working state. ``("store", i)`` puts the working state x_i in a free slot;
  ``("free", i)`` releases it. ``("backward", i)`` reads x_{i-1}, in the order n, n-1, ..., 1,
  after the first sweep has computed the loss x_n.
- ``forwards`` counts forward actions: n with slots >= n-1, n + n(n-1)/2 with no slot.

Closed form. With beta(c, r) = C(c+r, c) and r the repetition number, beta(c, r-1) < l <= beta(c, r),
Griewank's fewest advances to reverse l steps with c checkpoints (x_0's included) are

    t(l, c) = r·l − beta(c+1, r−1).

Griewank's step l is advanced inside its own reversal (the "youturn"), whereas here the first sweep
computes x_n by a plain forward and backward n reads only x_{n-1}. Our chain is Griewank's with one
more step, the loss seed n+1, whose reversal costs nothing; hence

    forwards(n, slots) = t(n+1, slots+1)        (not n + t(n, slots+1), which is wrong for slots >= 1).

Why it beats one-level plans at small budgets: a one-level plan keeps k <= slots checkpoints for the
whole backward and replays each of its k+1 segments, of about n/(k+1) layers, from the segment's start
for every backward inside it, which is about n²/(2(k+1)) recomputed forwards. Revolve re-checkpoints
inside segments; each step is advanced at most r times, r the least with beta(slots+1, r) >= n+1,
which grows like n^(1/(slots+1)). With about log n slots, r ~ log n and the recompute grows like n·log n.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .schedule import Schedule

ACTIONS = ("forward", "store", "free", "backward")


def binomial_forwards(n_layers: int, slots: int) -> int:
    """Fewest forward actions for n layers and s slots: t(n+1, s+1) = r·(n+1) − beta(s+2, r−1)."""
    n = _check_count("binomial_forwards", "n_layers", n_layers, 1)
    s = _check_count("binomial_forwards", "slots", slots, 0)
    return _t(n + 1, s + 1)


def _beta(c: int, r: int) -> int:
    """beta(c, r) = C(c+r, c): the most steps c checkpoints reverse advancing each at most r times."""
    return math.comb(c + r, c) if r >= 0 else 0


def _repetition_number(l: int, c: int) -> int:
    """The r with beta(c, r−1) < l <= beta(c, r)."""
    r = 0
    while _beta(c, r) < l:
        r += 1
    return r


def _t(l: int, c: int) -> int:
    """Griewank's t(l, c) = r·l − beta(c+1, r−1): advances to reverse l steps with c checkpoints."""
    r = _repetition_number(l, c)
    return r * l - _beta(c + 1, r - 1)


def dp_forwards(n_layers: int, slots: int) -> int:
    """Fewest forward actions for n layers and s slots, by dynamic programming on the model.

    R(l, s): fewest forwards to run backward l..1 of a segment whose start is available and whose
    top x_l is not needed (backward l reads x_{l-1}), with s free slots:

        R(1, s) = 0,   R(l, 0) = (l−1) + R(l−1, 0),
        R(l, s) = min_{1<=m<l} m + R(l−m, s−1) + R(m, s)        (advance m, store x_m, reverse above, free).

    T(l, s): the same, but the first sweep must compute the top x_l (the loss) once:

        T(1, s) = 1,
        T(l, s) = min( l + R(l, s),  min_{1<=m<l} m + T(l−m, s−1) + R(m, s) if s >= 1 ).

    The answer is T(n, s); the closed form is never consulted.
    """
    n = _check_count("dp_forwards", "n_layers", n_layers, 1)
    s = min(_check_count("dp_forwards", "slots", slots, 0), n)
    for l in range(1, n + 1):
        for s_l in range(s + 1):
            _sweep_cost(l, s_l)  # fill the tables bottom-up so the recursion is one level deep
    return _sweep_cost(n, s)


@functools.cache
def _reverse_cost(l: int, s: int) -> int:
    """R(l, s), see ``dp_forwards``."""
    if l == 1:
        return 0
    if s == 0:
        return (l - 1) + _reverse_cost(l - 1, 0)
    return min(m + _reverse_cost(l - m, s - 1) + _reverse_cost(m, s) for m in range(1, l))


@functools.cache
def _sweep_cost(l: int, s: int) -> int:
    """T(l, s), see ``dp_forwards``."""
    if l == 1:
        return 1
    no_store = l + _reverse_cost(l, s)
    if s == 0:
        return no_store
    return min(no_store, min(m + _sweep_cost(l - m, s - 1) + _reverse_cost(m, s) for m in range(1, l)))


def one_level_forwards(n_layers: int, slots: int) -> int:
    """Fewest forwards of a one-level plan: n + Σ_j L_j(L_j−1)/2 over k+1 segments as equal as possible.

    A one-level plan stores k = min(slots, n−1) states during the first sweep and never moves them.
    Each backward i recomputes x_{i-1} from the nearest stored state below it (or x_0), so a segment
    of L layers costs (L−1) + (L−2) + ... + 0 = L(L−1)/2 recomputed forwards, in the same memory as
    revolve (the stored states plus the working state). Σ L_j(L_j−1)/2 with Σ L_j = n is convex, so
    equal lengths are best, and using every slot never hurts.
    """
    n = _check_count("one_level_forwards", "n_layers", n_layers, 1)
    k = min(_check_count("one_level_forwards", "slots", slots, 0), n - 1)
    L, longer = divmod(n, k + 1)
    return n + (k + 1 - longer) * L * (L - 1) // 2 + longer * (L + 1) * L // 2


@dataclass(frozen=True)
class Revolve:
    """A schedule: the actions that reverse ``n_layers`` layers with ``slots`` slots, in order."""

    n_layers: int
    slots: int
    actions: tuple[tuple[str, int], ...]

    @property
    def forwards(self) -> int:
        """Number of forward actions, first sweep included."""
        return sum(1 for kind, _ in self.actions if kind == "forward")

    @property
    def recomputed(self) -> int:
        """Forwards beyond the first sweep: forwards − n."""
        return self.forwards - self.n_layers

    def peak_slots(self) -> int:
        """The most slots in use at once."""
        in_use = peak = 0
        for kind, _ in self.actions:
            in_use += {"store": 1, "free": -1}.get(kind, 0)
            peak = max(peak, in_use)
        return peak

    def schedule(self, graph):
        """These actions as a Checkmate schedule on a captured chain of ``n_layers`` one-node
        layers and a loss (``x_i = op(x_{i-1}, W_i)``, then a scalar): node i-1 is x_i, node n
        the loss. A first-sweep forward is its node's frontier stage; a later one is a
        recomputation in the stage of the backward that comes next. A stage keeps the stored
        states and the working state."""
        n = self.n_layers
        _check_chain(graph, n)
        T = graph.stages
        R = np.zeros((T, graph.n), dtype=bool)
        S = np.zeros((T, graph.n), dtype=bool)
        stored: set[int] = set()
        working = 0
        stage = 0
        for (kind, i), t in zip(self.actions, _stages(self.actions, n)):
            while stage < t:  # hand the stored states and the working state on to the next stage
                stage += 1
                S[stage, [j - 1 for j in stored | {working} if j >= 1]] = True
                if stage == n:
                    R[n, n] = True  # the loss
            if kind == "forward":
                R[t, i - 1] = True
                working = i
            elif kind == "store":
                stored.add(i)
            elif kind == "free":
                stored.discard(i)
        S &= ~R  # a state computed again in a stage need not be kept into it: its users come after
        return Schedule(graph, R, S, f"revolve ({self.slots} slots)")


def revolve(n_layers: int, slots: int) -> Revolve:
    """The binomial schedule: ``binomial_forwards(n, slots)`` forwards, at most ``slots`` stored.

    It reverses Griewank's chain of n+1 steps (step n+1 is the loss seed, reversed for free) with
    c = slots+1 checkpoints: from an available x_start, advance m = ``_advance(l, c)`` steps, store
    x_mid, reverse the upper l−m steps with c−1 checkpoints, free x_mid, reverse the lower m with c.
    An upper part of one step needs no slot: its input is the working state.
    """
    n = _check_count("revolve", "n_layers", n_layers, 1)
    s = _check_count("revolve", "slots", slots, 0)
    actions: list[tuple[str, int]] = []
    todo: list[tuple] = [("reverse", 0, n + 1, s)]  # a stack, not recursion: no slot means depth n
    while todo:
        item = todo.pop()
        if item[0] == "free":
            actions.append(item)
            continue
        _, start, end, free_slots = item
        if end - start == 1:
            actions.extend([("backward", end)] if end <= n else [])
            continue
        mid = start + _advance(end - start, free_slots + 1)
        actions.extend(("forward", i) for i in range(start + 1, mid + 1))
        if end - mid == 1:
            todo += [("reverse", start, mid, free_slots), ("reverse", mid, end, free_slots)]
        else:
            actions.append(("store", mid))
            todo += [("reverse", start, mid, free_slots), ("free", mid), ("reverse", mid, end, free_slots - 1)]
    return Revolve(n, s, tuple(actions))


def _advance(l: int, c: int) -> int:
    """Steps to advance before the next checkpoint, the largest optimal one (l >= 2, c >= 1).

    t(l, c) = m + t(l−m, c−1) + t(m, c) exactly when the lower part needs at most r−1 repetitions
    and the upper at most r:  max(1, beta(c, r−2), l − beta(c−1, r)) <= m <= min(beta(c, r−1), l − beta(c−1, r−1)).
    Pascal's rule beta(c, r) = beta(c, r−1) + beta(c−1, r) makes the interval non-empty.
    """
    r = _repetition_number(l, c)
    return min(_beta(c, r - 1), l - _beta(c - 1, r - 1))


def _stages(actions, n: int) -> list[int]:
    """The stage of each action: a first forward of x_i is stage i-1, the backward of layer i
    stage 2n+2-i (after the loss's stage n and its backward's n+1); anything else belongs to
    the stage of the first forward before it (in the first sweep) or the backward after it."""
    first, stages, current, swept = set(), [], 0, False
    for kind, i in actions:
        if kind == "forward" and i not in first:
            first.add(i)
            current = i - 1
            swept = i == n
            stages.append(current)
        elif kind == "backward":
            stages.append(2 * n + 2 - i)
        elif swept:
            stages.append(None)
        else:
            stages.append(current)
    following, out = None, []
    for s in reversed(stages):  # a pending action takes the stage of the backward after it
        following = s if s is not None else following
        out.append(following)
    return out[::-1]


def _check_chain(graph, n: int) -> None:
    nodes = graph.nodes
    if graph.n != n + 1 or any(nodes[k].deps != ((k - 1,) if k else ()) for k in range(n + 1)):
        raise ValueError(f"Revolve.schedule: expected a chain of {n} one-node layers and a loss "
                         f"(node k reads node k-1), got {graph.n} nodes")


def check_actions(n_layers: int, slots: int, actions) -> None:
    """Replay ``actions`` under the model; raise ValueError at the first one it forbids."""
    n = _check_count("check_actions", "n_layers", n_layers, 1)
    s = _check_count("check_actions", "slots", slots, 0)
    stored: set[int] = set()
    working, reached, next_backward = 0, 0, n  # x_0 plays the working state before any forward
    for step, action in enumerate(actions):
        kind, i = _parse_action(step, action, n)
        where = f"check_actions: action {step} {action!r}"
        if kind == "forward":
            _require_available(where, i - 1, stored, working, reached)
            working, reached = i, max(reached, i)
        elif kind == "store":
            if working != i or i in stored:
                raise ValueError(f"{where} stores x_{i}, but the working state is x_{working} "
                                 f"and the slots hold {sorted(stored)}")
            if len(stored) >= s:
                raise ValueError(f"{where} needs a slot, but all {s} hold {sorted(stored)}")
            stored.add(i)
        elif kind == "free":
            if i not in stored:
                raise ValueError(f"{where} frees x_{i}, which is not stored (slots hold {sorted(stored)})")
            stored.remove(i)
        else:
            if reached < n:
                raise ValueError(f"{where} comes before the first sweep computed x_{n} (it reached x_{reached})")
            if i != next_backward:
                raise ValueError(f"{where} is out of order: backward {next_backward} is next")
            _require_available(where, i - 1, stored, working, reached)
            next_backward -= 1
    if next_backward:
        raise ValueError(f"check_actions: the actions end before backward {next_backward}; "
                         f"backwards must run from {n} down to 1")


def _parse_action(step: int, action, n: int) -> tuple[str, int]:
    """(kind, i) with kind one of ACTIONS and i in its range: 1..n, or 1..n−1 for store and free."""
    if not (isinstance(action, tuple) and len(action) == 2 and action[0] in ACTIONS
            and isinstance(action[1], (int, np.integer)) and not isinstance(action[1], bool)):
        raise ValueError(f"check_actions: action {step} {action!r} is not (kind, index) "
                         f"with kind one of {', '.join(ACTIONS)}")
    kind, i = action[0], int(action[1])
    top = n - 1 if kind in ("store", "free") else n
    if not 1 <= i <= top:
        raise ValueError(f"check_actions: action {step} {action!r} has index {i} outside 1..{top}")
    return kind, i


def _require_available(where: str, j: int, stored: set[int], working: int, reached: int) -> None:
    """x_j is available when it is x_0, stored, or the working state."""
    if j > reached:
        raise ValueError(f"{where} needs x_{j}, which has not been computed yet (the sweep reached x_{reached})")
    if j != 0 and j not in stored and j != working:
        raise ValueError(f"{where} needs x_{j}, which is neither stored ({sorted(stored)}) "
                         f"nor the working state (x_{working})")


def _check_count(fn: str, name: str, value, minimum: int) -> int:
    """``value`` as an int, if it is an integer (not a bool) >= minimum."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{fn}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
