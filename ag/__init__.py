"""ag: a from-scratch NumPy autograd engine that teaches memory and IO in deep learning."""
from . import attention, lab, memory_model, nn, remat, trace
from .trace import count_ops
from .ops import (ShapeError, add, concat, div, dropout, exp, gelu, getitem, layer_norm, linear, log,
                  log_softmax, logsumexp, matmul, max, mean, mul, neg, pow, relu, reshape,
                  scaled_masked_softmax, sigmoid, softmax, sqrt, sub, sum, tanh, transpose, where)
from .arrays import unbroadcast
from .discard import discard_value_if_has_rematerializer, release_unneeded
from .errors import GraphError
from .modes import config, eager_grads, no_grad
from .lab import set_workers
from .tensor import Saved, Tensor, accumulate_grad, backward, make_output, topological_sort

__version__ = "0.1.0"

__all__ = [
    "Tensor", "GraphError", "ShapeError", "trace", "remat", "attention", "lab", "nn", "memory_model", "count_ops", "config", "no_grad", "eager_grads",
    "set_workers",
    "backward", "topological_sort", "accumulate_grad", "unbroadcast", "make_output", "Saved",
    "discard_value_if_has_rematerializer", "release_unneeded",
    "add", "sub", "mul", "div", "neg", "pow", "matmul", "sum", "mean", "max", "exp", "log",
    "sqrt", "relu", "tanh", "sigmoid", "gelu", "linear", "reshape", "transpose", "getitem", "concat",
    "softmax", "log_softmax", "logsumexp", "where", "layer_norm", "dropout", "scaled_masked_softmax",
]
