"""Offloading (NeMo's activation offloading): a checkpoint leaves memory after forward and comes back for backward.

``offloaded(layers, x, directory)`` runs a chain of layers and gives each output but the last a
rematerializer that reads its value back from where ``store`` wrote it: a file per tensor (np.memmap)
for a NumPy value, host memory for a CuPy one. The value is dropped once the next layer has run (its
forward may read it twice), and backward's first step that needs it reads it back; that read also starts
the next one backward will need on a thread, so it is (mostly) there when its step comes.

The trade against recomputing: offloading moves 2·bytes over a link of B bytes/s, recomputing redoes
FLOPs at F FLOP/s; offloading wins when 2·bytes/B < FLOPs/F and the transfer cannot hide behind compute.
"""
from __future__ import annotations

import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import remat
from .arrays import array_module
from .discard import discard_value_if_has_rematerializer, release_unneeded
from .tensor import Tensor
from .trace import device_module, end_trace, snapshot_trace, start_trace

Layer = Callable[[Tensor], Tensor]


class Offloader:
    """Where offloaded values go (``directory``, a file each) and the one thread that reads them back early."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ValueError(f"Offloader: {str(directory)!r} is not a directory; expected an existing folder "
                             "to write the offloaded values to (tempfile.mkdtemp() makes one)")
        self.reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ag-offload")
        self.order: list[Tensor] = []  # forward order: backward wants them from the last
        self.reading: dict[int, Future] = {}
        self.bytes_written = self.bytes_read = self.early_reads = 0

    def store(self, tensor: Tensor) -> None:
        """Write ``tensor``'s value out and make it recomputable from there (the engine then drops it)."""
        value, index = tensor.value, len(self.order)
        if array_module(value) is not np:  # a GPU value goes to host memory
            tensor.rematerializer = _Host(self, index, value.get(), array_module(value))
        else:
            path = self.directory / f"{index}.bin"
            disk = np.memmap(path, dtype=value.dtype, mode="w+", shape=value.shape)
            disk[...] = value
            disk.flush()
            del disk
            tensor.rematerializer = _Read(self, index, path, value.dtype, value.shape)
        self.bytes_written += value.nbytes
        self.order.append(tensor)

    def take(self, index: int, read: Callable[[], np.ndarray]) -> np.ndarray:
        """The value of the ``index``-th stored tensor: from its early read if one started, and start the next."""
        future = self.reading.pop(index, None)
        value = future.result() if future is not None else read()
        self.early_reads += future is not None
        self.bytes_read += value.nbytes
        if index > 0 and index - 1 not in self.reading and self.order[index - 1].value is None:
            self.reading[index - 1] = self.reader.submit(self.order[index - 1].rematerializer.read)
        return value

    def close(self) -> None:
        self.reader.shutdown(wait=True)


class _Read:
    """A tensor's rematerializer: its value, read back from ``path``."""

    def __init__(self, offloader: Offloader, index: int, path: Path, dtype, shape) -> None:
        self.offloader, self.index, self.path, self.dtype, self.shape = offloader, index, path, dtype, shape

    def read(self) -> np.ndarray:
        return np.fromfile(self.path, dtype=self.dtype).reshape(self.shape)

    def __call__(self) -> np.ndarray:
        return self.offloader.take(self.index, self.read)


class _Host:
    """A GPU tensor's rematerializer: its value, copied back from host memory."""

    def __init__(self, offloader: Offloader, index: int, host: np.ndarray, xp) -> None:
        self.offloader, self.index, self.host, self.xp = offloader, index, host, xp

    def read(self):
        return self.xp.asarray(self.host)

    def __call__(self):
        return self.offloader.take(self.index, self.read)


def offloaded(layers: Sequence[Layer], x: Tensor, offloader: Offloader) -> Tensor:
    """Run ``layers`` on ``x``, storing every output but the last with ``offloader`` once the next layer
    has run (a layer may read its input more than once: a transformer's residual) and dropping its value."""
    h = x
    for k, layer in enumerate(layers):
        out = layer(h)
        release_unneeded([out], [h])  # what no backward step reads goes now, as remat.sequential does
        if k > 0:
            offloader.store(h)
            discard_value_if_has_rematerializer(h)
        h = out
    return h


def measure_step(step: Callable[[], None], repeats: int = 3, device: str = "cpu") -> dict:
    """One training step (``step()`` runs forward and backward): the peak bytes above what was alive
    before (tracemalloc, or CuPy's pool on ``device="gpu"``; the first run) and the best of ``repeats``
    timed runs, in seconds."""
    start_trace(device)
    try:
        step()
        peak = snapshot_trace().peak_bytes
    finally:
        end_trace()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - began)
    return {"peak_bytes": peak, "seconds": min(times, default=float("nan"))}


def synchronize(device) -> None:
    """Wait for the GPU's queued kernels (CuPy launches them asynchronously), so a step's time is its own."""
    if device != "cpu":
        cuda = getattr(device_module(device), "cuda", None)
        if hasattr(cuda, "Device"):
            cuda.Device().synchronize()


def offload_step(layers: Sequence[Layer], x: Tensor) -> Callable[[], None]:
    """Forward with every output but the last offloaded to a fresh temporary directory, then backward."""
    def step() -> None:
        with tempfile.TemporaryDirectory(prefix="ag-offload-") as directory:
            offloader = Offloader(directory)
            try:
                out = offloaded(layers, x, offloader)
                out.backward(np.ones_like(out.value))
            finally:
                offloader.close()
    return step


def recompute_step(layers: Sequence[Layer], x: Tensor, budget_bytes: int) -> Callable[[], None]:
    """Forward keeping the outputs of remat's optimal plan at ``budget_bytes``, recomputing the rest; backward."""
    chain = remat.profile(layers, x)
    kept = remat.plan(len(layers), "optimal", chain=chain, budget_bytes=budget_bytes)

    def step() -> None:
        out = remat.sequential(layers, x, kept)
        out.backward(np.ones_like(out.value))
    return step


def keep_step(layers: Sequence[Layer], x: Tensor) -> Callable[[], None]:
    """Forward keeping every output (and what backward reads inside each layer); backward."""
    def step() -> None:
        out = remat.sequential(layers, x, remat.plan(len(layers), "keep all"))
        out.backward(np.ones_like(out.value))
    return step


def compare(layers: Sequence[Layer], x: Tensor, budget_bytes: int, repeats: int = 3,
            device: str = "cpu") -> dict[str, dict]:
    """Peak bytes and step seconds of keeping everything, recomputing at ``budget_bytes`` and offloading."""
    return {"keep": measure_step(keep_step(layers, x), repeats, device),
            "recompute": measure_step(recompute_step(layers, x, budget_bytes), repeats, device),
            "offload": measure_step(offload_step(layers, x), repeats, device)}
