"""Running a chain with checkpoints: ``sequential`` keeps the outputs it is told to keep and gives
every other output a rematerializer that replays the layers from the nearest kept one.

Indices: layer k's output is ``x_k``; the chain's input (index -1) is always kept. A layer whose
output is kept keeps everything it made that backward reads; a layer whose output is not kept
has its output and its internals recomputed, by replaying the layers from the nearest kept
output. ``schedule.sequential_matrices`` writes what it runs as R and S on the chain's graph:
that is what ``predict`` prices. Each layer is a node of the one runner (``remat.runner``):
made once with a graph in the forward, made again without one by a replay in backward.
"""
from __future__ import annotations

import weakref
from typing import Callable, Sequence

import numpy as np

from ...hooks import record_tensors
from ...discard import release_unneeded
from ...errors import GraphError
from ...tensor import Tensor
from ..runner import Runner


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
    for k in range(len(chain.layers)):
        out, made = chain.compute(k, h)
        if k in kept:
            last_kept = k
        else:
            chain.make_recomputable(k, last_kept, made, out)
        h = out
    return h


class Chain(Runner):
    """The one runner on a chain: node k is layer k, and what it made is its Tensors.

    It holds the tensors weakly: the graph decides how long they live, as without it.
    """

    def __init__(self, layers: list[Layer], x: Tensor, mode: str) -> None:
        super().__init__(len(layers))
        self.layers, self.x, self.mode = layers, x, mode
        self.made: list[list[weakref.ref]] = []
        self.outputs: list[weakref.ref] = []
        self.wanted = _nothing  # the tensor a replay is for: the engine puts its value back itself

    def run_layer(self, k: int, h: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Layer k on h: its output, and every Tensor it made, in order."""
        with record_tensors() as made:
            out = self.layers[k](h)
        if not isinstance(out, Tensor):
            raise TypeError(f"sequential: layer {k} returned {type(out).__name__}, expected a Tensor")
        release_unneeded([out], [h])  # no graph on a replay: nothing to release
        return out, made

    def first(self, k: int, h: Tensor) -> tuple[Tensor, list[Tensor]]:
        out, made = self.run_layer(k, h)
        self.made.append([weakref.ref(t) for t in made])
        self.outputs.append(weakref.ref(out))
        return out, made

    def again(self, k: int, h: Tensor) -> tuple[Tensor, list[Tensor]]:
        out, again = self.run_layer(k, h)
        self._put_back(k, again)
        self.restored(k)
        return out, again

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
        h, self.wanted = first, weakref.ref(wanted)
        for k in range(start + 1, stop):
            h = self.compute(k, h)[0]  # the layer's other values go now, unless put back
        again = self.compute(stop, h)[1]
        for ref, new in zip(self.made[stop], again):
            if ref() is wanted:
                return new.value
        raise GraphError(f"replay of layers {start + 1}..{stop} did not recompute {wanted.describe()}")

    def restored(self, k: int) -> None:
        """Called after layer k's values were restored by a replay."""

    def _put_back(self, k: int, again: list[Tensor]) -> None:
        """Check that replayed layer k made what its forward made; in segment mode, put back
        each value that is gone and that a backward step still reads (but the replay's own:
        the engine puts that back from what ``replay`` returns)."""
        first, wanted = self.made[k], self.wanted()
        if len(again) != len(first):
            raise GraphError(f"replay of layer {k} made {len(again)} tensors where the forward made "
                             f"{len(first)}: a replayed layer must run the same ops")
        for ref, new in zip(first, again):
            original = ref()
            if original is None:
                continue
            if original.shape != new.shape:
                raise GraphError(f"replay of layer {k} made shape {new.shape} where the forward "
                                 f"made {original.shape} for {original.describe()}")
            if (self.mode == "segment" and original is not wanted and original.value is None
                    and original._needed_by > 0):
                original.value = new.value


def _nothing() -> None:
    return None


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
