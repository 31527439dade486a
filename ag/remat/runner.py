"""The one runner: whichever planner wrote a schedule, its nodes are computed on the engine here.

Node k is computed the first time with a graph (``first``): fresh Tensors, each with its backward
closure. Computed again, it runs without a graph, under the phase "recompute" (``again``), and its
values go back into the Tensors of the first time, whose closures never went away.

A node is an op of a captured graph (``graphs.execute.Run``) or a layer of a chain
(``chains.sequential.Chain``). Two drivers run it: ``execute`` plays every event of a schedule,
backward steps included, to measure each; ``sequential`` plays the forward and leaves backward to
the engine, where a dropped value's ``rematerializer`` recomputes it through this runner (lecture 3).
"""
from __future__ import annotations

from ..modes import no_grad
from ..scopes import phase


class Runner:
    """Computes the nodes of a schedule; ``times[k]`` counts how often node k was computed."""

    def __init__(self, n: int) -> None:
        self.times = [0] * n

    def compute(self, k: int, x=None):
        """Node k, from x where it does not find its input itself (a chain's layer does not):
        with a graph the first time, without one after, into the same Tensors."""
        if self.times[k] == 0:
            result = self.first(k, x)
        else:
            with no_grad(), phase("recompute"):
                result = self.again(k, x)
        self.times[k] += 1
        return result

    def first(self, k: int, x):
        """Make node k with a graph and hold on to its Tensors."""
        raise NotImplementedError

    def again(self, k: int, x):
        """Make node k without a graph and put its values into the Tensors of the first time."""
        raise NotImplementedError
