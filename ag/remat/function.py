"""The function form of recomputation (``torch.utils.checkpoint``, Megatron's and NeMo's):
keep a block's inputs only, and rerun the block in backward."""
from __future__ import annotations

from typing import Callable

from ..modes import no_grad, phase
from ..discard import release_unneeded
from ..errors import GraphError
from ..tensor import Saved, Tensor, accumulate_grad, backward, make_output


def checkpoint(fn: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
    """y = fn(*inputs), keeping nothing that fn makes inside: only the inputs are saved.

    Forward runs ``fn`` under ``no_grad``, so it builds no graph and its intermediates are
    freed as it goes. Backward runs ``fn`` again on the saved inputs, this time with a graph,
    and backpropagates ``dy`` through that rerun: one extra forward of the block, the price of
    not storing its activations. ``fn`` must compute the same thing twice (seed its dropout).
    """
    for t in inputs:
        if not isinstance(t, Tensor):
            raise TypeError(f"checkpoint: inputs must be Tensors, got {type(t).__name__}")
    with no_grad():
        y = fn(*inputs)
    if not isinstance(y, Tensor):
        raise TypeError(f"checkpoint: fn returned {type(y).__name__}, expected a Tensor")

    def _backward(out: Tensor, saved: Saved) -> None:
        again = [Tensor(saved[t], requires_grad=t.requires_grad) for t in inputs]
        with phase("recompute"):
            rerun = fn(*again)
        release_unneeded([rerun], again)  # as the first forward would have: keep what backward reads
        if rerun.shape != out.shape:
            raise GraphError(f"checkpoint: fn returned shape {rerun.shape} on its rerun, "
                             f"{out.shape} the first time")
        backward(rerun, out.grad)
        for t, a in zip(inputs, again):
            if a.grad is not None:
                accumulate_grad(t, a.grad)
    return make_output(y.value, "checkpoint", inputs, _backward, saves=inputs)
