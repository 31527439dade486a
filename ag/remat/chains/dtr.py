"""Dynamic tensor rematerialization (DTR, Kirisame et al.) on a chain: no plan; evict at run time
the output with the lowest cost / (bytes × staleness) whenever the chain's resident bytes pass
the budget, and replay it from the nearest resident output when something reads it."""
from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np

from ...tensor import Tensor
from ...trace import count_ops
from .sequential import Chain, Layer


def dynamic_chain(layers: Sequence[Layer], x: Tensor, budget_bytes: int) -> Tensor:
    """Run ``layers`` with no plan: keep outputs until the chain's resident bytes pass
    ``budget_bytes``, then evict the layer with the lowest
    cost / (bytes × staleness) (Kirisame et al., Dynamic Tensor Rematerialization), where
    cost is the FLOPs to replay it from the nearest resident output. An evicted value is
    replayed when something reads it, and the budget is enforced again.
    """
    if budget_bytes is None or budget_bytes <= 0:
        raise ValueError(f"dynamic: budget_bytes must be positive, got {budget_bytes!r}")
    chain = _Dynamic(list(layers), x, int(budget_bytes))
    h = x
    for k in range(len(chain.layers)):
        with count_ops() as counts:
            out, _ = chain.compute(k, h)
        chain.costs.append(max(1, sum(counts.flops.values())))
        chain.touch(k)
        chain.enforce_budget(protect={k})
        h = out
    return h


class _Dynamic(Chain):
    """A chain whose layers are evicted and replayed at run time, under a byte budget."""

    def __init__(self, layers: list[Layer], x: Tensor, budget: int) -> None:
        super().__init__(layers, x, "segment")
        self.budget = budget
        self.costs: list[int] = []
        self.last_use: list[int] = []
        self.clock = 0
        self.evictions = 0
        self.wanted_layer = -1

    def touch(self, k: int) -> None:
        self.clock += 1
        self.last_use.extend([0] * (k + 1 - len(self.last_use)))
        self.last_use[k] = self.clock

    def _live(self, k: int) -> list[Tensor]:
        return [t for t in (ref() for ref in self.made[k]) if t is not None and t.value is not None]

    def resident_bytes(self) -> int:
        return sum(t.nbytes for k in range(len(self.made)) for t in self._live(k))

    def _replay_cost(self, k: int) -> int:
        cost, j = self.costs[k], k - 1
        while j >= 0 and not self._resident(j):
            cost += self.costs[j]
            j -= 1
        return cost

    def _resident(self, k: int) -> bool:
        out = self.outputs[k]()
        return out is not None and out.value is not None

    def enforce_budget(self, protect: set[int]) -> None:
        while self.resident_bytes() > self.budget:
            scores = []
            for k in range(len(self.made)):
                live = self._live(k)
                if k in protect or not live:
                    continue
                staleness = self.clock - self.last_use[k] + 1
                size = sum(t.nbytes for t in live)
                scores.append((self._replay_cost(k) / (size * staleness), k))
            if not scores:
                return  # everything left is in use right now: run over budget rather than fail
            self.evict(min(scores)[1])

    def evict(self, k: int) -> None:
        for t in self._live(k):
            t.rematerializer = _DynamicReplay(self, k, t)
            t.value = None
        self.evictions += 1

    def replay_to(self, k: int, wanted: Tensor) -> np.ndarray:
        start = k - 1
        while start >= 0 and not self._resident(start):
            start -= 1
        self.wanted_layer = k
        return self.replay(start, k, wanted)

    def restored(self, k: int) -> None:
        self.touch(k)
        self.enforce_budget(protect={k, self.wanted_layer, self.wanted_layer + 1})


class _DynamicReplay:
    """An evicted tensor's rematerializer: replay from the nearest resident output."""

    def __init__(self, chain: _Dynamic, k: int, tensor: Tensor) -> None:
        self.chain, self.k = chain, k
        self.tensor = weakref.ref(tensor)

    def __call__(self) -> np.ndarray:
        return self.chain.replay_to(self.k, self.tensor())
