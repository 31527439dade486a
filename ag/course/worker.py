"""The worker: the only process in which a student's code runs.

It bounds its own memory when the judge says how much it may map beyond its start (``headroom``),
imports the student's exercise, puts its functions into an ag in which that exercise is a
stub, says it is ready, and then answers the judge's requests one at a time: run this probe
on these arguments, send back what it returns. A probe only collects data (values, arrays,
byte counts); it never decides whether a test passed. Exceptions come back as their type and
a message clipped to a few hundred characters. The worker's exit code, stdout and stderr are
never read.
"""
from __future__ import annotations

import importlib
import json
import re
import resource
import socket
import sys
import traceback
from pathlib import Path

import numpy as np

from . import channel
from .exercises import EXERCISES
from .install import install, load_submission

CLIP = 300


def probe(function):
    """Mark a graded test's helper as a probe: it runs in the worker, on the student's module
    (its first argument) and data from the judge, and returns data for the judge's check."""
    function.__ag_probe__ = True
    return function


def main(fd: int, options: dict) -> None:
    sock = socket.socket(fileno=fd)
    try:
        bound_memory(options.get("headroom"))
        student = _load(options)
    except BaseException as error:  # noqa: B036 -- SystemExit at import is the student's too
        channel.send(sock, {"ready": False, "error": describe(error, options["submission"])})
        return
    channel.send(sock, {"ready": True})
    while True:
        try:
            request = channel.receive(sock)
        except channel.ChannelError:
            return  # the judge is done with us
        reply = _answer(request, student, options["submission"])
        try:
            channel.send(sock, reply)
        except TypeError as error:  # nothing was sent: say why instead
            message = clip(f"the result cannot be sent to the judge: {error}")
            channel.send(sock, {"error": {"type": "TypeError", "message": message, "where": ""}})


def bound_memory(headroom: int | None) -> None:
    """RLIMIT_AS = what this process maps now (Python, NumPy, ag, BLAS's buffer) + ``headroom``
    bytes, soft and hard: set before any student code runs, which can only lower it. A probe
    sized past the headroom is then decisive whatever the machine's own mappings weigh."""
    if headroom is None:
        return
    np.ones((64, 64)) @ np.ones((64, 64))  # BLAS maps its buffer at its first product: the worker's own
    limit = mapped_bytes() + headroom
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def mapped_bytes() -> int:
    """This process's address space in bytes (``VmSize``, what RLIMIT_AS bounds)."""
    with open("/proc/self/status") as status:
        return int(re.search(r"^VmSize:\s+(\d+) kB", status.read(), re.M).group(1)) * 1024


def _load(options: dict):
    exercise = next(e for e in EXERCISES if e.number == options["exercise"])
    module = load_submission(options["submission"], exercise)
    install(module)
    return module


def _answer(request: dict, student, submission: str) -> dict:
    try:
        function = _probe_named(request["probe"])
        value = function(student, *request["args"], **request["kwargs"])
    except BaseException as error:  # noqa: B036 -- sys.exit in student code fails the probe only
        return {"error": describe(error, submission)}
    return {"ok": value}


def _probe_named(name: str):
    """The probe "module:function" (the judge checked that it is marked @probe)."""
    module_name, _, qualname = name.partition(":")
    return getattr(importlib.import_module(module_name), qualname)


def describe(error: BaseException, submission: str) -> dict:
    """An exception as data: its type, its message clipped, and where in the submission it arose."""
    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if Path(frame.filename).parent == Path(submission):
            where = f"{Path(frame.filename).name}, line {frame.lineno}"
            break
    try:
        message = str(error)
    except BaseException:  # noqa: B036 -- a hostile __str__
        message = "(the exception's message could not be printed)"
    return {"type": clip(type(error).__name__, 80), "message": clip(message), "where": where}


def clip(text: str, limit: int = CLIP) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit:,} characters cut]"


if __name__ == "__main__":
    main(int(sys.argv[1]), json.loads(sys.argv[2]))
