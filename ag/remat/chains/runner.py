"""Running a chain with checkpoints: ``sequential`` keeps the outputs it is told to keep and gives
every other output a rematerializer that replays the layers from the nearest kept one.

Indices: layer k's output is ``x_k``; the chain's input (index -1) is always kept. A layer whose
output is kept keeps everything it made that backward reads; a layer whose output is not kept
has its output and its internals recomputed, by replaying the layers from the nearest kept
output under ``no_grad``. ``schedule.sequential_matrices`` writes what it runs as R and S on the
chain's graph: that is what ``predict`` prices.
"""
from __future__ import annotations

import weakref
from typing import Callable, Sequence

import numpy as np

from ...hooks import record_tensors
from ...modes import no_grad
from ...discard import release_unneeded
from ...errors import GraphError
from ...tensor import Tensor


Layer = Callable[[Tensor], Tensor]


def sequential(layers: Sequence[Layer], x: Tensor, checkpoints: Sequence[int], *,
               mode: str = "segment") -> Tensor:
    """Run ``layers`` on ``x`` keeping only the outputs listed in ``checkpoints``.

    ``mode="segment"`` (Chen et al.): the first time backward needs a value between two
    checkpoints, the whole run of layers up to it is replayed once and every value that
    backward will read is kept until read: one extra forward in all.
    ``mode="tensor"`` (the lecture's rematerializer): each value is recomputed on its own
    from the nearest checkpoint and nothing else is kept: least memory, quadratic recompute.
    """
    if mode not in ("segment", "tensor"):
        raise ValueError(f"sequential: mode must be 'segment' or 'tensor', got {mode!r}")
    kept = check_checkpoints("sequential", checkpoints, len(layers))
    chain = Chain(list(layers), x, mode)
    h, last_kept = x, -1
    for k, layer in enumerate(chain.layers):
        with record_tensors() as made:
            out = layer(h)
        if not isinstance(out, Tensor):
            raise TypeError(f"sequential: layer {k} returned {type(out).__name__}, expected a Tensor")
        release_unneeded([out], [h])
        chain.add(made, out)
        if k in kept:
            last_kept = k
        else:
            chain.make_recomputable(k, last_kept, made, out)
        h = out
    return h


class Chain:
    """What a replay needs: the layers, what each made the first time, and the kept outputs.

    It holds the tensors weakly: the graph decides how long they live, as without it.
    """

    def __init__(self, layers: list[Layer], x: Tensor, mode: str) -> None:
        self.layers, self.x, self.mode = layers, x, mode
        self.made: list[list[weakref.ref]] = []
        self.outputs: list[weakref.ref] = []

    def add(self, made: list[Tensor], out: Tensor) -> None:
        self.made.append([weakref.ref(t) for t in made])
        self.outputs.append(weakref.ref(out))

    def make_recomputable(self, k: int, start: int, made: list[Tensor], out: Tensor) -> None:
        for t in made:
            if t.value is None:
                continue  # released: no backward step reads it
            t.rematerializer = _Replay(self, start, k, t)
            if t is not out:
                t.value = None  # already consumed inside the layer: not a checkpoint
        # the output is discarded by the engine when the next layer consumes it

    def replay(self, start: int, stop: int, wanted: Tensor) -> np.ndarray:
        """Recompute layers start+1..stop from the kept output ``start``; return ``wanted``'s value."""
        first = self.x if start < 0 else self.outputs[start]()
        if first is None or first.value is None:
            raise GraphError(f"replay of layers {start + 1}..{stop}: the kept output x_{start} "
                             "is gone; was backward already past it?")
        h, found = first, None
        with no_grad():
            for k in range(start + 1, stop + 1):
                with record_tensors() as again:
                    h = self.layers[k](h)
                value = self._restore(k, again, wanted)
                found = value if value is not None else found
                self.restored(k)
        if found is None:
            raise GraphError(f"replay of layers {start + 1}..{stop} did not recompute {wanted.describe()}")
        return found

    def restored(self, k: int) -> None:
        """Called after layer k's values were restored by a replay."""

    def _restore(self, k: int, again: list[Tensor], wanted: Tensor) -> np.ndarray | None:
        first = self.made[k]
        if len(again) != len(first):
            raise GraphError(f"replay of layer {k} made {len(again)} tensors where the forward made "
                             f"{len(first)}: a replayed layer must run the same ops")
        found = None
        for ref, new in zip(first, again):
            original = ref()
            if original is None:
                continue
            if original.shape != new.shape:
                raise GraphError(f"replay of layer {k} made shape {new.shape} where the forward "
                                 f"made {original.shape} for {original.describe()}")
            if original is wanted:
                found = new.value
            elif self.mode == "segment" and original.value is None and original._needed_by > 0:
                original.value = new.value
        return found


class _Replay:
    """A tensor's rematerializer: replay layers start+1..stop and hand back its value."""

    def __init__(self, chain: Chain, start: int, stop: int, tensor: Tensor) -> None:
        self.chain, self.start, self.stop = chain, start, stop
        self.tensor = weakref.ref(tensor)  # a strong one would be a cycle through the tensor

    def __call__(self) -> np.ndarray:
        return self.chain.replay(self.start, self.stop, self.tensor())


def check_checkpoints(op: str, checkpoints: Sequence[int], n: int) -> set[int]:
    """The kept layer indices as a set, each checked to lie in 0..n-1 (``op`` names the caller in errors)."""
    kept = set()
    for c in checkpoints:
        if not isinstance(c, (int, np.integer)) or not 0 <= c < n:
            raise ValueError(f"{op}: checkpoint {c!r} is not a layer index in 0..{n - 1}")
        kept.add(int(c))
    return kept
