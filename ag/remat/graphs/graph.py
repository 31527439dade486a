"""One training step as a graph of op outputs, the way Checkmate sees a model (Jain et al. 2020).

A node is one op output. It knows its bytes, its forward FLOPs (as ``count_ops`` counts them),
the nodes among its arguments (``deps``), and how to be computed again: every ag op is a
function, so capture keeps the function and the arguments it held when it made its output,
and any node can be recomputed by calling its op once more on its inputs' values.

A backward step is one node's ``_backward``: it reads the values the op declared (``saves=``,
and the output where ``saves_output``). What the node's graph keeps beside them, its hidden
bytes (its Tensor, the closure, and the arrays that keeps: dropout's mask, flash attention's
logsumexp), lives from the node's first computation to its backward step, whatever the plan: a
captured graph has no seed to draw a mask again from.

``capture`` (``ag.remat.capture``) records one; ``ag.remat.model`` turns what it measured into
one memory model, shared by every planner and by ``execute``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...tensor import Tensor


class CaptureError(ValueError):
    """``fn`` cannot be captured: it returns no scalar loss with a graph, or calls an op ag cannot re-run."""


@dataclass(frozen=True)
class Call:
    """An op and the arguments it ran with: the node's recipe."""

    fn: Callable
    args: tuple
    kwargs: dict

    def run(self, value_of: Callable[[Tensor], Tensor]):
        """Call the op again, each Tensor argument replaced by ``value_of(tensor)`` and each array
        argument by a copy (a dropout mask is drawn again: the same bits, in new memory)."""
        out = self.fn(*_swap(self.args, value_of), **{k: _swap(v, value_of) for k, v in self.kwargs.items()})
        return out[0] if isinstance(out, tuple) else out

    def tensors(self) -> list[Tensor]:
        found: list[Tensor] = []

        def walk(x) -> None:
            if isinstance(x, Tensor):
                found.append(x)
            elif isinstance(x, (list, tuple)):
                for item in x:
                    walk(item)
        walk(self.args)
        walk(tuple(self.kwargs.values()))
        return found


def _swap(x, value_of):
    """x with its Tensors replaced and its arrays copied (a module function, not a closure: a
    recursive closure is a reference cycle, garbage that tracemalloc would count until gc runs)."""
    if isinstance(x, Tensor):
        return value_of(x)
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, (list, tuple)):
        return type(x)([_swap(item, value_of) for item in x])
    return x


@dataclass(eq=False)
class Node:
    """One op output of the captured step."""

    index: int
    op: str
    shape: tuple[int, ...]
    dtype: np.dtype
    bytes: int              # its own buffer; 0 for a view of another node's
    hidden_bytes: int       # its Tensor, closure and the arrays that keeps (a mask), until its backward step
    flops: int
    deps: tuple[int, ...]   # the nodes among its arguments
    view_of: int | None     # the node whose buffer it views
    has_backward: bool
    scope: tuple[str, ...]  # the scopes (``scopes.scope``) it was made in, outermost first: "transformer layer#0"
    call: Call
    workspace_bytes: int = 0  # transient bytes while it is computed, above what it leaves behind

    @property
    def size(self) -> int:
        """What keeping its value costs (a view: nothing, its base pays)."""
        return self.bytes

    @property
    def label(self) -> str:
        return f"{self.index}:{self.op}"


@dataclass(eq=False)
class BackwardStep:
    """One node's backward step, and what it needs and costs whatever the plan."""

    node: int
    reads: tuple[int, ...]  # nodes that must be resident when it runs
    grad_bytes: int = 0     # grads alive just before it
    extra_bytes: int = 0    # its transient peak above the bytes alive before it


@dataclass(eq=False)
class Graph:
    """A captured training step: nodes in the order the forward made them, backward steps in the
    order ``backward()`` runs them, and the leaves (inputs and parameters) they read."""

    nodes: list[Node]
    steps: list[BackwardStep]
    leaves: list[Tensor]
    loss: int
    originals: list[Tensor] = field(default_factory=list, repr=False)  # the capture run's node tensors
    users: list[tuple[int, ...]] = field(init=False)
    storage_of: list[int] = field(init=False)

    def __post_init__(self) -> None:
        users: list[list[int]] = [[] for _ in self.nodes]
        for node in self.nodes:
            for d in node.deps:
                users[d].append(node.index)
        self.users = [tuple(u) for u in users]
        self.index_of = {id(t): k for k, t in enumerate(self.originals)}
        self.storage_of = []
        for node in self.nodes:  # a view keeps its base's buffer alive
            self.storage_of.append(node.index if node.view_of is None else self.storage_of[node.view_of])

    @property
    def n(self) -> int:
        return len(self.nodes)

    @property
    def stages(self) -> int:
        """Checkmate's frontier-advancing stages: one per node in forward, one per backward step."""
        return len(self.nodes) + len(self.steps)

    @property
    def leaf_bytes(self) -> int:
        return int(sum(t.nbytes for t in self.leaves))

    @property
    def forward_flops(self) -> int:
        return int(sum(node.flops for node in self.nodes))

    def hidden_bytes_at(self, stage: int) -> int:
        """Hidden bytes alive when ``stage`` starts: of the nodes made before it whose backward
        step has not run (a forward stage t follows the first computations of nodes 0..t-1)."""
        n = len(self.nodes)
        if stage < n:
            return sum(node.hidden_bytes for node in self.nodes[:stage])
        ran = {step.node for step in self.steps[:stage - n]}
        return sum(node.hidden_bytes for node in self.nodes if node.index not in ran)

    def views(self, index: int) -> list[int]:
        """The nodes that view ``index``'s buffer, directly or through other views."""
        return [v.index for v in self.nodes if v.view_of is not None and v.index != index
                and self.storage_of[v.index] == self.storage_of[index] and v.index > index]

    def with_bases(self, indices) -> set[int]:
        """``indices`` and every node whose buffer one of them views."""
        out: set[int] = set()
        for i in indices:
            while i is not None and i not in out:
                out.add(i)
                i = self.nodes[i].view_of
        return out

    def summary(self) -> str:
        mb = 1e6
        return (f"{self.n} nodes, {len(self.steps)} backward steps, {self.forward_flops:,} forward FLOPs, "
                f"values {sum(n.size for n in self.nodes) / mb:.2f} MB, leaves {self.leaf_bytes / mb:.2f} MB")

    def draw(self, ax=None, *, schedule=None):
        """Nodes left to right in forward order (area ∝ bytes, colour by op), an arc per edge,
        matplotlib; with ``schedule``, its R (computed) and S (kept) matrices below, as Checkmate draws them."""
        import matplotlib.pyplot as plt
        if ax is None:
            rows = 2 if schedule is not None else 1
            fig, axes = plt.subplots(rows, 1, figsize=(10, 3 + 4 * (rows - 1)), squeeze=False)
            ax = axes[0][0]
            if schedule is not None:
                schedule.draw(axes[1][0])
        ops = sorted({node.op for node in self.nodes})
        colours = {op: plt.get_cmap("tab20")(i % 20) for i, op in enumerate(ops)}
        biggest = max((node.size for node in self.nodes), default=1) or 1
        for node in self.nodes:
            for d in node.deps:
                mid, height = (node.index + d) / 2, (node.index - d) / 2
                arc = np.linspace(0, np.pi, 30)
                ax.plot(mid + height * np.cos(arc), 0.15 * height * np.sin(arc), lw=0.6, color="0.6", zorder=1)
        ax.scatter([n.index for n in self.nodes], [0] * self.n, zorder=2,
                   s=[20 + 300 * n.size / biggest for n in self.nodes],
                   c=[colours[n.op] for n in self.nodes], edgecolors="k", linewidths=0.4)
        for op in ops:
            ax.scatter([], [], color=colours[op], label=op)
        ax.legend(ncol=min(6, len(ops)), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.05), frameon=False)
        ax.set_yticks([])
        ax.set_title(f"captured step: {self.summary()}", fontsize=9)
        return ax
