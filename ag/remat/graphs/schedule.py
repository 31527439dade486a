"""A schedule as data: Checkmate's R (computed) and S (kept) matrices over stages, whichever
planner made it; ``model.simulate`` prices it and ``execute`` runs it."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .graph import Graph
from .model import Prediction, simulate


@dataclass(eq=False)
class Schedule:
    """Stage by stage, which nodes are computed (``R``) and which are kept into the stage (``S``).

    ``status`` is "optimal" when the planner proved it, "feasible" when a time limit stopped the
    proof (then ``gap`` and ``lower_bound``, the best bound on recompute FLOPs, say how far it
    can be), and "heuristic" for planners that prove nothing.
    """

    graph: Graph
    R: np.ndarray
    S: np.ndarray
    planner: str
    budget_bytes: int | None = None
    status: str = "heuristic"
    gap: float | None = None
    lower_bound: float | None = None
    solve_seconds: float = 0.0
    prediction: Prediction = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.R = np.asarray(self.R, dtype=bool)
        self.S = np.asarray(self.S, dtype=bool)
        self.prediction = simulate(self.graph, self.R, self.S)

    @property
    def predicted_peak_bytes(self) -> int:
        return self.prediction.peak_bytes

    @property
    def recompute_flops(self) -> int:
        return self.prediction.recompute_flops

    def peak_step(self) -> int | None:
        """The backward step in whose stage the predicted peak is reached (None: in forward)."""
        t = self.prediction.peak_stage
        return t - self.graph.n if t >= self.graph.n else None

    def recomputed(self) -> list[int]:
        """The nodes computed more than once."""
        return [int(i) for i in np.flatnonzero(self.R.sum(axis=0) > 1)]

    def dropped(self) -> list[int]:
        """The nodes some backward step reads that are not kept from forward to that step: not
        resident at the start of some stage between their first computation and the step's
        (so recomputed on the way, in that step or an earlier one)."""
        n, out = self.graph.n, set()
        for j, step in enumerate(self.graph.steps):
            for i in step.reads:
                if not self.S[i + 1:n + j + 1, i].all():
                    out.add(i)
        return sorted(out)

    def __repr__(self) -> str:
        return (f"Schedule({self.planner}, {self.status}, predicted peak {self.predicted_peak_bytes:,} B, "
                f"recompute {self.recompute_flops:,} FLOPs)")

    def draw(self, ax=None):
        """R and S as one image: dark = computed in that stage, light = kept into it."""
        import matplotlib.pyplot as plt
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 6))
        image = np.where(self.R, 2, np.where(self.S, 1, 0))
        ax.imshow(image, cmap=plt.get_cmap("Greys"), vmin=0, vmax=2, aspect="auto", interpolation="nearest")
        ax.axhline(self.graph.n - 0.5, color="tab:red", lw=0.8)
        ax.set_xlabel("node")
        ax.set_ylabel("stage (forward above the line, backward below)")
        ax.set_title(f"{self.planner}: R (dark) and S (light)", fontsize=9)
        return ax


def cheapest_within(schedules, budget_bytes: int) -> Schedule | None:
    """The schedule that recomputes least among those whose predicted peak fits ``budget_bytes``
    (None entries are skipped; None when none fits)."""
    fitting = [s for s in schedules if s is not None and s.predicted_peak_bytes <= budget_bytes]
    return min(fitting, key=lambda s: s.recompute_flops, default=None)
