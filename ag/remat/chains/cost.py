"""What a chain plan costs: a chain's per-layer bytes and FLOPs (``profile``), the plan as the
schedule ``sequential`` runs (``sequential_schedule``), and its peak bytes and recomputed FLOPs
(``predict``): the ``Prediction`` that ``model.simulate`` gives every schedule."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...modes import no_grad
from ...tensor import Tensor
from ...trace import count_ops
from ..graphs.model import Prediction
from ..graphs.schedule import Schedule
from .sequential import Layer, check_checkpoints
from .schedule import chain_graph, sequential_matrices


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


def sequential_schedule(chain, checkpoints: Sequence[int], *, mode: str = "segment") -> Schedule:
    """What ``sequential(layers, x, checkpoints, mode=mode)`` runs, as a schedule on the chain's
    graph: note 6's R and S, priced by its memory model (``.prediction``, ``.draw()``)."""
    if mode not in ("segment", "tensor"):
        raise ValueError(f"sequential_schedule: mode must be 'segment' or 'tensor', got {mode!r}")
    p = as_profile(chain)
    kept = check_checkpoints("sequential_schedule", checkpoints, p.n)
    R, S = sequential_matrices(p.n, kept, mode)
    return Schedule(chain_graph(p.sizes, p.costs, kept), R, S, f"sequential ({mode})")


def predict(chain, checkpoints: Sequence[int], *, mode: str = "segment") -> Prediction:
    """Peak activation bytes and recomputed FLOPs of keeping ``checkpoints``: the schedule
    ``sequential`` runs (``sequential_schedule``), priced by ``model.simulate``.

    Alive at backward step m (layer m, from n-1 down): the kept outputs up to m, the replayed
    values of the run before m (segment mode) or the values being replayed (tensor mode:
    two at a time, then x_{m-1}), and two grads, x_m's and x_{m-1}'s. Forward holds the kept
    outputs, the layer's input and its output.
    """
    return sequential_schedule(chain, checkpoints, mode=mode).prediction
