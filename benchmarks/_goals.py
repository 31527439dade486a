"""Each goal as one line of a benchmark's output: what is compared, the figure, the goal, met or missed.

    goal: MLP float32 time, ag / torch (median) = 0.93 (goal <= 1): met
    goal: per-op add, forward with a graph, ag / torch = 1.21 (goal <= 1): missed; limited by ...

A missed goal says what limits it, never hidden. ``run_all.py`` gathers these lines.
"""
from __future__ import annotations


def verdict(ratio: float, goal: float, resolution: float = 0.0) -> str:
    """"met" when ``ratio <= goal`` (within the method's ``resolution``), else "missed"."""
    return "met" if ratio <= goal + resolution else "missed"


def shown(ratio: float, goal: float | tuple[float, ...], resolution: float = 0.0, digits: int = 2) -> str:
    """``ratio`` with ``digits`` decimals, or as many more as it takes for the text to get the
    ratio's own verdict: 1.2038 against a goal of 1.2 reads 1.204, not 1.20 next to "missed".
    A goal line reads its ratio back from a table's text, so the text must decide as the value does,
    against every goal in ``goal`` when it is a tuple (a goal and its stretch goal)."""
    goals = goal if isinstance(goal, tuple) else (goal,)
    for places in range(digits, 10):
        text = f"{ratio:.{places}f}"
        if all(verdict(float(text), g, resolution) == verdict(ratio, g, resolution) for g in goals):
            return text
    return repr(ratio)


def goal(what: str, ratio: float, limit: float, *, limited_by: str = "", resolution: float = 0.0) -> str:
    """Print (and return) the goal line for ``what``: ``ratio`` against ``limit``."""
    result = verdict(ratio, limit, resolution)
    line = f"goal: {what} = {shown(ratio, limit, resolution)} (goal <= {limit:g}): {result}"
    if result == "missed" and limited_by:
        line += f"; limited by {limited_by}"
    print(line)
    return line
