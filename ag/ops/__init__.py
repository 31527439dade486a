"""The ops: each computes on NumPy arrays and states its gradient right beside it.

Every op is a plain function in the ``ag`` namespace (``ag.matmul(a, b)``) and, where
Python has one, an operator on Tensor (``a @ b``). Each reads in the same order: check the
inputs, compute the value, define ``_backward(out, saved)``, return ``make_output``. The
closure reads ``out.grad`` and ``saved[t]`` for exactly the tensors the op declared in
``saves=`` (``saved[out]`` with ``saves_output=True``) and returns its inputs' grads, one for
each input (None where none is needed); the engine adds them into the inputs' ``.grad``,
allocating lazily and undoing broadcasting.

``sum``, ``max`` and ``pow`` are the lecture's names; inside ag they are called as
``ops.sum`` so that no other module shadows Python's built-ins.
"""
from __future__ import annotations

from ..errors import ShapeError  # what the ops raise on bad shapes
from ..tensor import Tensor
# one concept a file
from .operands import as_tensor
from .elementwise import add, div, mul, neg, pow, sub
from .matmul import linear, matmul
from .reductions import log_softmax, logsumexp, max, mean, softmax, sum
from .unary import exp, gelu, log, relu, sigmoid, sqrt, tanh
from .fused import dropout, layer_norm, scaled_masked_softmax
from .shape import concat, getitem, reshape, transpose, where


# ---- operators on Tensor ----

def _reflected(op):
    return lambda self, other: op(other, self)


Tensor.__add__ = add
Tensor.__radd__ = _reflected(add)
Tensor.__sub__ = sub
Tensor.__rsub__ = _reflected(sub)
Tensor.__mul__ = mul
Tensor.__rmul__ = _reflected(mul)
Tensor.__truediv__ = div
Tensor.__rtruediv__ = _reflected(div)
Tensor.__matmul__ = matmul
Tensor.__rmatmul__ = _reflected(matmul)
Tensor.__pow__ = pow
Tensor.__neg__ = neg
Tensor.__getitem__ = getitem
Tensor.T = property(lambda self: transpose(self))
Tensor.sum = sum
Tensor.mean = mean
Tensor.max = max
Tensor.exp = exp
Tensor.log = log
Tensor.sqrt = sqrt
Tensor.relu = relu
Tensor.tanh = tanh
Tensor.sigmoid = sigmoid
Tensor.reshape = reshape
Tensor.transpose = transpose
Tensor.softmax = softmax
