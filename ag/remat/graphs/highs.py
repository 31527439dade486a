"""The solvers' plumbing: scipy's HiGHS imported on first use, a wall-clock deadline, and
``milp`` run where the deadline can stop it (HiGHS reads its clock only between iterations)."""
from __future__ import annotations

import multiprocessing
import time
from types import SimpleNamespace


class OutOfTime(Exception):
    """The wall-clock deadline passed while a solver was still building or solving."""


def check_deadline(deadline: float) -> None:
    if time.perf_counter() > deadline:
        raise OutOfTime


def highs_api() -> SimpleNamespace:
    try:
        from scipy import sparse
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        raise ImportError("checkmate needs scipy's HiGHS: pip install 'ag[solver]'") from None
    return SimpleNamespace(sparse=sparse, Bounds=Bounds, LinearConstraint=LinearConstraint, milp=milp)


def solve_by_deadline(milp, deadline: float, *args, **kwargs):
    """scipy's ``milp`` in a forked child, stopped at ``deadline``: HiGHS reads its clock between
    iterations only, and loading a large model outlasts a small time limit by itself. Stopped, it
    answers as HiGHS does at its limit with nothing found (status 1, no x)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return milp(*args, **kwargs)  # HiGHS's own limit only
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_milp_into, args=(sender, milp, args, kwargs), daemon=True)
    child.start()
    sender.close()
    try:
        if receiver.poll(None if deadline == float("inf") else max(0.0, deadline - time.perf_counter())):
            return receiver.recv()
        return SimpleNamespace(status=1, x=None, fun=None, mip_dual_bound=None)
    except EOFError:  # the child died without an answer
        return SimpleNamespace(status=1, x=None, fun=None, mip_dual_bound=None)
    finally:
        child.kill()
        child.join()
        receiver.close()


def _milp_into(sender, milp, args, kwargs) -> None:
    sender.send(milp(*args, **kwargs))
    sender.close()
