"""A stand-in for CuPy on machines without a GPU, to test that ag's engine is array-module agnostic.

``fakedevice.ndarray`` holds a NumPy array "on the device" and behaves towards NumPy as
``cupy.ndarray`` does: NumPy functions and ufuncs called on it dispatch to it (NEP 13 and
NEP 18) and return device arrays; it refuses to become a NumPy array implicitly
(``np.asarray(x)`` raises TypeError, as in CuPy); and an operation that mixes it with a
host ``numpy.ndarray`` raises TypeError (NumPy scalars are allowed, as CuPy allows them).
So a computation that silently falls back to the host, or builds a host array and mixes
it in, fails here as it would on a GPU. The module itself offers the few creation
functions ag asks an array module for (``zeros``, ``asarray``, ``arange``, ...).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

class HostMixError(TypeError):
    pass


@dataclass(frozen=True)
class Flags:
    """CuPy's ``ndarray.flags``: contiguity and ownership, and no ``writeable`` flag."""

    c_contiguous: bool
    f_contiguous: bool
    owndata: bool


def _unwrap(x, where: str):
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray):
        raise HostMixError(f"fakedevice: {where} mixes a device array with a host numpy.ndarray of shape {x.shape}")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(i, where) for i in x)
    if isinstance(x, dict):
        return {k: _unwrap(v, where) for k, v in x.items()}
    return x


def _wrap(x):
    if isinstance(x, np.ndarray):
        return ndarray(x)
    if isinstance(x, np.generic):  # CuPy's reductions give 0-d device arrays, not host scalars
        return ndarray(np.asarray(x))
    if isinstance(x, tuple):
        return tuple(_wrap(i) for i in x)
    if isinstance(x, list):
        return [_wrap(i) for i in x]
    return x


def _contiguous(a):
    """What CuPy's matmul does to each operand of a stack of matrices (ndim > 2) before cuBLAS's
    strided-batched product: a C-contiguous copy of one that is not, such as a transposed view
    (``ascontiguousarray`` in cupy/_core/_routines_linalg.pyx), made in the pool as CuPy's is."""
    if not isinstance(a, np.ndarray) or a.flags.c_contiguous:
        return a
    return ndarray(np.ascontiguousarray(a))._a


class ndarray:
    """A NumPy array behind a device boundary."""

    __array_priority__ = 100

    def __init__(self, a: np.ndarray) -> None:
        self._a = a
        _pool.track(a)

    def __array__(self, *args, **kwargs):
        raise TypeError("fakedevice: implicit conversion to a NumPy array is not allowed; use .get()")

    def get(self) -> np.ndarray:
        """Copy to the host, as cupy.ndarray.get()."""
        return self._a.copy()

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        where = f"np.{ufunc.__name__}.{method}" if method != "__call__" else f"np.{ufunc.__name__}"
        if "where" in kwargs:  # as CuPy's ufuncs: TypeError: Wrong arguments {'where': ...}
            raise TypeError(f"fakedevice: {where} takes no where= (CuPy's ufuncs do not)")
        out = kwargs.get("out")
        arrays = _unwrap(inputs, where)
        if ufunc is np.matmul and max(np.ndim(a) for a in arrays) > 2:
            arrays = [_contiguous(a) for a in arrays]
        result = getattr(ufunc, method)(*arrays, **_unwrap(kwargs, where))
        if out is not None:  # written in place: hand back the caller's device arrays
            return out[0] if len(out) == 1 else out
        return _wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        where = f"np.{func.__name__}"
        if "where" in kwargs and func is not np.copyto:  # cupy.sum, amax, ... take no where= either
            raise TypeError(f"fakedevice: {where} takes no where= (CuPy's does not)")
        result = func(*_unwrap(args, where), **_unwrap(kwargs, where))
        return _wrap(result)

    # the ndarray surface ag uses
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    flags = property(lambda self: Flags(self._a.flags.c_contiguous, self._a.flags.f_contiguous,
                                        self._a.flags.owndata))
    strides = property(lambda self: self._a.strides)
    base = property(lambda self: None if self._a.base is None else ndarray(self._a.base))
    T = property(lambda self: ndarray(self._a.T))
    real = property(lambda self: ndarray(self._a.real))

    def __repr__(self) -> str:
        return f"fakedevice.ndarray({self._a!r})"

    def __len__(self) -> int:
        return len(self._a)

    def __bool__(self) -> bool:
        return bool(self._a)

    def __float__(self) -> float:
        return float(self._a)

    def __int__(self) -> int:
        return int(self._a)

    def __index__(self) -> int:
        return self._a.__index__()

    def item(self):
        return self._a.item()

    def __getitem__(self, index):
        return _wrap(self._a[_unwrap(index, "indexing")])

    def __setitem__(self, index, value):
        self._a[_unwrap(index, "indexing")] = _unwrap(value, "assignment")

    def reshape(self, *shape, **kwargs):
        return ndarray(self._a.reshape(*shape, **kwargs))

    def astype(self, dtype, copy: bool = True, **kwargs):
        return ndarray(self._a.astype(dtype, copy=copy, **kwargs))

    def copy(self, *args, **kwargs):
        return ndarray(self._a.copy(*args, **kwargs))

    def view(self, *args, **kwargs):
        return ndarray(self._a.view(*args, **kwargs))

    def transpose(self, *axes):
        return ndarray(self._a.transpose(*axes))

    def swapaxes(self, a, b):
        return ndarray(self._a.swapaxes(a, b))

    def sum(self, *args, **kwargs):
        return np.sum(self, *args, **kwargs)

    def max(self, *args, **kwargs):
        return np.max(self, *args, **kwargs)

    def mean(self, *args, **kwargs):
        return np.mean(self, *args, **kwargs)

    def dot(self, other):  # cupy.ndarray.dot, as ndarray.dot
        return np.dot(self, other)

    def all(self, *args, **kwargs):
        return np.all(self, *args, **kwargs)

    def any(self, *args, **kwargs):
        return np.any(self, *args, **kwargs)


def _binary(ufunc, reflected: bool = False):
    if reflected:
        return lambda self, other: ufunc(other, self)
    return lambda self, other: ufunc(self, other)


for _name, _ufunc in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                      ("pow", np.power), ("matmul", np.matmul), ("floordiv", np.floor_divide), ("mod", np.mod)]:
    setattr(ndarray, f"__{_name}__", _binary(_ufunc))
    setattr(ndarray, f"__r{_name}__", _binary(_ufunc, reflected=True))
    setattr(ndarray, f"__i{_name}__", lambda self, other, u=_ufunc: u(self, other, out=(self,)))
for _name, _ufunc in [("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                      ("eq", np.equal), ("ne", np.not_equal), ("and", np.logical_and), ("or", np.logical_or)]:
    setattr(ndarray, f"__{_name}__", _binary(_ufunc))
ndarray.__neg__ = lambda self: np.negative(self)
ndarray.__abs__ = lambda self: np.absolute(self)
ndarray.__invert__ = lambda self: np.invert(self)
ndarray.__hash__ = None


class MemoryPool:
    """Like CuPy's: ``used_bytes()`` is the bytes of the device buffers alive now."""

    def __init__(self) -> None:
        self._live: dict[int, int] = {}

    def track(self, a: np.ndarray) -> None:
        if a.base is None and id(a) not in self._live:
            self._live[id(a)] = a.nbytes
            weakref.finalize(a, self._live.pop, id(a), None)
            for hook in list(_hooks):
                hook.malloc_postprocess(device_id=0, size=a.nbytes, mem_size=a.nbytes, mem_ptr=id(a), pmem_id=0)

    def used_bytes(self) -> int:
        return sum(self._live.values())


_pool = MemoryPool()
_hooks: list = []


class MemoryHook:
    """CuPy's ``cupy.cuda.memory_hook.MemoryHook``: active inside ``with hook:``."""

    name = "hook"

    def __enter__(self):
        _hooks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _hooks.remove(self)

    def malloc_postprocess(self, **kwargs) -> None:
        pass


cuda = SimpleNamespace(memory_hook=SimpleNamespace(MemoryHook=MemoryHook))


def get_default_memory_pool() -> MemoryPool:
    return _pool


# ---- the creation functions of an array module ----

def asarray(x, dtype=None) -> ndarray:
    if isinstance(x, ndarray):
        return x if dtype is None else x.astype(dtype, copy=False)
    return ndarray(np.array(x, dtype=dtype))  # from the host: a copy, as cupy.asarray makes


def to_device(x: np.ndarray) -> ndarray:
    """Copy a host array to the device, as cupy.asarray does."""
    return ndarray(np.array(x))


def zeros(shape, dtype=float) -> ndarray:
    return ndarray(np.zeros(shape, dtype))


def ones(shape, dtype=float) -> ndarray:
    return ndarray(np.ones(shape, dtype))


def empty(shape, dtype=float) -> ndarray:
    return ndarray(np.empty(shape, dtype))


def full(shape, value, dtype=None) -> ndarray:
    return ndarray(np.full(shape, value, dtype))


def arange(*args, **kwargs) -> ndarray:
    return ndarray(np.arange(*args, **kwargs))
