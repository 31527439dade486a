"""The function form of recomputation (``torch.utils.checkpoint``, Megatron's and NeMo's):
keep a block's inputs only, and rerun the block in backward. It sits beside the engine, so that
``nn`` can use it without ``remat``, the planners built on top."""
from __future__ import annotations

from typing import Callable

from .modes import no_grad
from .discard import release_unneeded
from .scopes import phase
from .errors import GraphError
from .tensor import Grads, Saved, Tensor, backward, backward_from_grad, make_output


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

    def _backward(out: Tensor, saved: Saved) -> Grads:
        again = [Tensor(saved[t], requires_grad=t.requires_grad) for t in inputs]
        with phase("recompute"):
            rerun = fn(*again)
        release_unneeded([rerun], again)  # as the first forward would have: keep what backward reads
        if rerun.shape != out.shape:
            raise GraphError(f"checkpoint: fn returned shape {rerun.shape} on its rerun, "
                             f"{out.shape} the first time")
        # an input returned, nothing that needs grad, another dtype or an eager grad: the general path
        if rerun.is_leaf or not rerun.requires_grad or rerun.dtype != out.dtype or rerun.grad is not None:
            backward(rerun, out.grad)
        else:
            _backward_through(rerun, out, saved)
        return tuple(a.grad for a in again)
    return make_output(y.value, "checkpoint", inputs, _backward, saves=inputs, call=(checkpoint, fn, *inputs))


def _backward_through(rerun: Tensor, out: Tensor, saved: Saved) -> None:
    """Backpropagate ``out``'s grad through the rerun block, holding no more than torch's
    checkpoint does: the rerun's output value goes if no step reads it, and ``out``'s grad becomes
    the rerun's without a copy when nothing reads it after this step, so it is freed after the
    rerun's first step, not kept through the whole block's backward."""
    if rerun._needed_by == 0:
        rerun.value = None
    rerun.grad = saved.writable_grad()
    if rerun.grad is out.grad:  # nothing reads it after this step: handed on, uncopied
        out.grad = None
    backward_from_grad(rerun)
