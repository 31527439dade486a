"""The channel between the judge and a worker: length-prefixed messages of plain data.

A message is JSON (None, bools, ints, floats, strings, lists, string-keyed dicts) with NumPy
arrays of numeric dtypes sent as raw bytes beside it. Nothing is ever unpickled, so a worker
can send the judge wrong data but never an object that runs code or compares equal to anything:
``decode`` rebuilds only plain values and fresh arrays, and refuses everything else.

Frame: 8-byte big-endian length, then the payload; payload: 4-byte header length, the JSON
header, then the arrays' bytes in order. Arrays appear in the JSON as {"__array__": i}.
"""
from __future__ import annotations

import json
import math
import socket
import struct
import time

import numpy as np

MAX_MESSAGE = 256 * 2**20  # a reply larger than this costs the test, never the judge's memory
MAX_HEADER = 2**20  # the JSON part: bulk data travels as arrays, which cost no more than their bytes
MAX_DEPTH = 32
DTYPES = frozenset("?bBhHiIlLqQefdgFDG")  # numeric and bool: no objects, strings or records


class ChannelError(RuntimeError):
    """The other side sent something that is not a valid message, too much, or nothing in time."""


def encode(value) -> bytes:
    """The payload for ``value``; raises TypeError for anything but plain data and numeric arrays."""
    arrays: list[np.ndarray] = []
    header = json.dumps(_plain(value, arrays, 0), allow_nan=True).encode()
    chunks = [struct.pack(">I", len(header)), header]
    for a in arrays:
        chunks.append(np.ascontiguousarray(a).tobytes())
    return b"".join(chunks)


def _plain(value, arrays: list, depth: int):
    if depth > MAX_DEPTH:
        raise TypeError(f"data nested deeper than {MAX_DEPTH} levels")
    if value is None or type(value) in (bool, str):
        return value
    if type(value) is int:
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, np.generic) and value.dtype.char in DTYPES:
        return _plain(value.item(), arrays, depth + 1)
    if type(value) is np.ndarray:
        if value.dtype.char not in DTYPES:
            raise TypeError(f"an array of dtype {value.dtype} cannot be sent: numeric arrays only")
        arrays.append(value)
        return {"__array__": len(arrays) - 1, "dtype": value.dtype.str, "shape": list(value.shape)}
    if type(value) in (list, tuple):
        return [_plain(v, arrays, depth + 1) for v in value]
    if type(value) is dict and all(type(k) is str for k in value):
        return {"__dict__": {k: _plain(v, arrays, depth + 1) for k, v in value.items()}}
    raise TypeError(f"an object of type {type(value).__module__}.{type(value).__qualname__} cannot be "
                    "sent: only None, bool, int, float, str, list, tuple, str-keyed dict and numeric "
                    "NumPy arrays")


def decode(payload: bytes):
    """The value ``encode`` made; raises ChannelError for anything malformed."""
    try:
        (size,) = struct.unpack(">I", payload[:4])
        if size > MAX_HEADER:  # decoding JSON costs ~10x its size in memory: refuse before parsing
            raise ChannelError(f"the message's plain data is {size:,} bytes; at most {MAX_HEADER:,} "
                               "(send numbers as NumPy arrays)")
        header = json.loads(payload[4:4 + size])
        view = memoryview(payload)[4 + size:]
        offset = [0]
        value = _rebuild(header, view, offset, 0)
    except ChannelError:
        raise
    except Exception as error:  # a malformed payload: say what, never trust it
        raise ChannelError(f"malformed message: {type(error).__name__}: {str(error)[:200]}") from None
    if offset[0] != len(view):
        raise ChannelError(f"malformed message: {len(view) - offset[0]} bytes after the last array")
    return value


def _rebuild(node, view: memoryview, offset: list, depth: int):
    if depth > MAX_DEPTH:
        raise ChannelError(f"malformed message: nested deeper than {MAX_DEPTH} levels")
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is list:
        return [_rebuild(v, view, offset, depth + 1) for v in node]
    if type(node) is not dict or len(node) not in (1, 3):
        raise ChannelError("malformed message: unexpected JSON object")
    if set(node) == {"__dict__"} and type(node["__dict__"]) is dict:
        return {str(k): _rebuild(v, view, offset, depth + 1) for k, v in node["__dict__"].items()}
    if set(node) == {"__float__"} and node["__float__"] in ("nan", "inf", "-inf"):
        return float(node["__float__"])
    if set(node) == {"__array__", "dtype", "shape"}:
        return _array(node, view, offset)
    raise ChannelError("malformed message: unexpected JSON object")


def _array(node: dict, view: memoryview, offset: list) -> np.ndarray:
    dtype = np.dtype(str(node["dtype"]))
    shape = tuple(int(n) for n in node["shape"])
    if dtype.char not in DTYPES or any(n < 0 for n in shape):
        raise ChannelError(f"malformed message: array of dtype {dtype} and shape {shape}")
    nbytes = math.prod(shape) * dtype.itemsize
    if offset[0] + nbytes > len(view):
        raise ChannelError("malformed message: an array runs past the end of the message")
    data = view[offset[0]:offset[0] + nbytes]
    offset[0] += nbytes
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def send(sock: socket.socket, value) -> None:
    """Send one message; raises TypeError (before sending anything) if ``value`` is not data."""
    payload = encode(value)
    sock.sendall(struct.pack(">Q", len(payload)) + payload)


def receive(sock: socket.socket, timeout: float | None = None, limit: int = MAX_MESSAGE):
    """The next message, within ``timeout`` seconds in all; ChannelError on EOF, excess or time-out."""
    deadline = None if timeout is None else time.monotonic() + timeout
    (size,) = struct.unpack(">Q", _read(sock, 8, deadline))
    if size > limit:
        raise ChannelError(f"the reply is {size:,} bytes; at most {limit:,} are read")
    return decode(_read(sock, size, deadline))


def _read(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelError("no reply in time")
            sock.settimeout(remaining)
        try:
            chunk = sock.recv(min(left, 1 << 20))
        except socket.timeout:
            raise ChannelError("no reply in time") from None
        except OSError as error:
            raise ChannelError(f"the channel broke: {error}") from None
        if not chunk:
            raise ChannelError("the worker closed the channel (it exited or was killed)")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
