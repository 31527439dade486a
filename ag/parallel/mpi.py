"""The communicator: the ranks of one group and the collectives ag's parallel schemes need.

    all_reduce      Σ over ranks, on every rank                     (data and tensor parallelism)
    all_gather      the ranks' pieces joined, on every rank          (sequence parallelism, ZeRO-3)
    reduce_scatter  Σ over ranks, each rank keeping its 1/N          (sequence parallelism, ZeRO-2)

mpi4py is imported when a Group is made, so that ag imports without MPI. ``StandIn`` is one rank of a
group run alone, in one process, for measuring what a rank holds without mpiexec.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as error:  # pragma: no cover - depends on the machine
        raise ImportError("ag.parallel needs mpi4py and an MPI library: pip install 'ag[mpi]'") from error
    return MPI


class Group:
    """The ranks of one group (tensor-parallel, data-parallel or a pipeline's stages) and their collectives.

    Reductions run in at least float32 (MPI has no float16 sum); gathers move raw bytes.
    A float32 or float64 array is reduced where it lies, with no copy.
    """

    def __init__(self, comm=None) -> None:
        MPI = _mpi()
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.size, self.rank = self.comm.Get_size(), self.comm.Get_rank()

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        """Σ over ranks, on every rank."""
        buffer = np.array(x, dtype=np.promote_types(x.dtype, np.float32), order="C")
        self.comm.Allreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)
        return buffer.astype(x.dtype, copy=False)

    def all_reduce_in_place(self, x: np.ndarray) -> np.ndarray:
        """x ← Σ over ranks, in x's own buffer (a contiguous float32 or float64 array)."""
        self.comm.Allreduce(self.MPI.IN_PLACE, x, op=self.MPI.SUM)
        return x

    def all_gather(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The ranks' pieces joined along axis 0 (the sequence, a flat shard), on every rank: into ``out`` if given."""
        x = np.ascontiguousarray(x)
        if out is None:
            out = np.empty((self.size * x.shape[0],) + x.shape[1:], dtype=x.dtype)
        self.comm.Allgather([x, self.MPI.BYTE], [out, self.MPI.BYTE])
        return out

    def all_gather_in_place(self, x: np.ndarray) -> np.ndarray:
        """x ← the ranks' 1/N pieces of x joined: rank r sends its own piece, x[r·n:(r+1)·n], from x itself."""
        self.comm.Allgather(self.MPI.IN_PLACE, [x, self.MPI.BYTE])
        return x

    def reduce_scatter(self, x: np.ndarray) -> np.ndarray:
        """Σ over ranks, split along axis 0: each rank gets its 1/t of the sum."""
        if x.shape[0] % self.size:
            raise ValueError(f"reduce_scatter: axis 0 of shape {x.shape} does not split into {self.size} ranks")
        send = np.ascontiguousarray(x, dtype=np.promote_types(x.dtype, np.float32))
        out = np.empty((x.shape[0] // self.size,) + x.shape[1:], dtype=send.dtype)
        self.comm.Reduce_scatter_block(send, out, op=self.MPI.SUM)
        return out.astype(x.dtype, copy=False)

    def scatter_sequence(self, x: np.ndarray) -> np.ndarray:
        """This rank's contiguous 1/t of axis 0, as its own array (every rank holds x already)."""
        n = x.shape[0] // self.size
        return x[self.rank * n:(self.rank + 1) * n].copy()


class StandIn(Group):
    """Rank ``rank`` of ``size``, run alone: Group's collectives, allocating the same buffers, over a
    communicator whose absent peers send this rank's own pieces. What a rank holds does not depend on
    what its peers send, so its bytes measure as under mpiexec; its sums are not the group's sums."""

    def __init__(self, size: int, rank: int = 0) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"StandIn: rank={rank} of size={size}; expected 0 <= rank < size")
        self.MPI, self.comm = _ALONE, _AloneComm(size, rank)
        self.size, self.rank = size, rank


_ALONE = SimpleNamespace(IN_PLACE="in place", SUM="sum", MIN="min", MAX="max", BYTE="byte")


class _AloneComm:
    """The calls Group makes, for one rank whose peers are absent."""

    def __init__(self, size: int, rank: int) -> None:
        self.size, self.rank = size, rank

    def Allreduce(self, send, receive, op) -> None:
        pass  # in place: this rank's own values stand for the sum

    def Allgather(self, send, receive=None) -> None:
        if send is _ALONE.IN_PLACE:
            return
        piece, out = send[0], receive[0]
        out.reshape((self.size,) + piece.shape)[...] = piece

    def Reduce_scatter_block(self, send, out, op) -> None:
        n = out.shape[0]
        out[...] = send[self.rank * n:(self.rank + 1) * n]

    def allreduce(self, value, op=None):
        return value
