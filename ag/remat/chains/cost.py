"""What a chain plan costs: a chain's per-layer bytes and FLOPs (``profile``) and the peak bytes
and recomputed FLOPs that keeping some outputs predicts (``predict``), as the ``Prediction`` that
``model.simulate`` gives a schedule on a captured graph."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...modes import no_grad
from ...tensor import Tensor
from ...trace import count_ops
from ..graphs.model import Prediction
from .runner import Layer, check_checkpoints


@dataclass(frozen=True)
class ChainProfile:
    """A chain as the planner sees it: output bytes and forward FLOPs of each layer.

    The model assumes each layer's backward reads its input (as a matmul does), so
    backward needs x_{-1}..x_{n-2}; ``profile`` measures a real chain.
    """

    sizes: tuple[int, ...]
    costs: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.costs) or not self.sizes:
            raise ValueError(f"ChainProfile: need one size and one cost per layer, got "
                             f"{len(self.sizes)} sizes and {len(self.costs)} costs")

    @property
    def n(self) -> int:
        return len(self.sizes)


def profile(layers: Sequence[Layer], x) -> ChainProfile:
    """Run the chain once without a graph and record each layer's output bytes and FLOPs."""
    sizes, costs = [], []
    h = x.value if isinstance(x, Tensor) else x
    with no_grad():
        for layer in layers:
            with count_ops() as counts:
                out = layer(Tensor(h))
            sizes.append(out.nbytes)
            costs.append(sum(counts.flops.values()))
            h = out.value
    return ChainProfile(tuple(sizes), tuple(costs))


def as_profile(chain) -> ChainProfile:
    """Accept a ChainProfile, or a list of sizes (each layer then costs 1: FLOPs count layers)."""
    if isinstance(chain, ChainProfile):
        return chain
    sizes = tuple(int(s) for s in chain)
    return ChainProfile(sizes, (1,) * len(sizes))


def predict(chain, checkpoints: Sequence[int], *, mode: str = "segment") -> Prediction:
    """Peak activation bytes and recomputed FLOPs of keeping ``checkpoints`` (see ``sequential``).

    Alive at backward step m (layer m, from n-1 down): the kept outputs up to m, the
    replayed values of the run before m (segment mode) or the one value x_{m-1} (tensor
    mode), and two grads, x_m's and x_{m-1}'s. Forward holds the kept outputs, the layer's
    input and its output.
    """
    p = as_profile(chain)
    kept = check_checkpoints("predict", checkpoints, p.n)
    s, n = p.sizes, p.n
    peak, flops, layers = 0, 0, 0
    kept_up_to = np.cumsum([s[i] if i in kept else 0 for i in range(n)])
    for k in range(n):  # forward
        before = kept_up_to[k - 1] if k > 0 else 0
        transient = s[k - 1] if k > 0 and k - 1 not in kept else 0
        peak = max(peak, before + transient + s[k])
    for m in range(n - 1, -1, -1):  # backward
        new_grad = s[m - 1] if m > 0 else 0
        step = s[m] + new_grad  # x_m's grad, and x_{m-1}'s being made
        if m > 0 and m - 1 not in kept:
            start = max([c for c in kept if c < m - 1], default=-1)
            run = range(start + 1, m)
            if mode == "segment":
                step += sum(s[i] for i in run)
            else:  # the replay walks the run holding two values at a time, keeps only x_{m-1}
                walk = max((s[i] + s[i + 1] for i in run if i + 1 < m), default=0)
                step = s[m] + max(walk, s[m - 1] + new_grad)
                flops += sum(p.costs[i] for i in run)
                layers += len(run)
        peak = max(peak, kept_up_to[m] + step)
    if mode == "segment":
        flops, layers = _segment_recompute(p, kept)
    return Prediction(int(peak), int(flops), layers)


def _segment_recompute(p: ChainProfile, kept: set[int]) -> tuple[int, int]:
    """Each run of non-kept outputs that backward reads is replayed once."""
    needed = [i for i in range(p.n - 1) if i not in kept]  # x_0..x_{n-2} are read by backward
    return sum(p.costs[i] for i in needed), len(needed)
