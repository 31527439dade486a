"""What a Tensor offers its user besides the engine: its sizes, printing, and reading its value out.

``ag.tensor.Tensor`` builds on ``TensorBase``; the engine in ``tensor.py`` reads none of this but
``describe()`` (for its messages) and ``size``.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import GraphError


class TensorBase:
    """Sizes, printing and value access for a Tensor, whose ``value`` may be None (discarded)."""

    __slots__ = ()  # the fields are Tensor's

    value: np.ndarray | None
    shape: tuple[int, ...]
    dtype: np.dtype
    name: str | None
    op: str | None
    requires_grad: bool

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return 0 if self.value is None else self.value.nbytes

    def __repr__(self) -> str:
        label = f", name={self.name!r}" if self.name else ""
        grad = ", requires_grad=True" if self.requires_grad else ""
        if self.value is None:
            return f"Tensor(<discarded>{label}{grad})"
        return f"Tensor({np.array2string(self.value, threshold=20)}{grad}{label})"

    def __len__(self) -> int:
        return len(self._live_value("len"))

    def describe(self) -> str:
        """A short name for messages: the tensor's name, else the op that made it."""
        if self.name:
            return f"tensor '{self.name}'"
        return f"output of {self.op}" if self.op else "a leaf tensor"

    def numpy(self) -> np.ndarray:
        return self._live_value("numpy")

    def item(self) -> float:
        return self._live_value("item").item()

    def _live_value(self, what: str) -> np.ndarray:
        if self.value is None:
            raise GraphError(f"{what}: the value of {self.describe()} was discarded "
                             "(rematerialization or release); it has no value to read now")
        return self.value
