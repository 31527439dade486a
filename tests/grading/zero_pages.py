"""Ops on large arrays of zero pages, for the graded tests that measure memory where student code
cannot fake it: each value or grad costs address space (counted against the worker's 3 GiB) but
almost no time, since only its first 4 elements are ever written. A top-level file of the tests
folder, so the worker gets it with the probes that use it."""
import numpy as np

from ag import tensor  # the engine adds the returned grads with tensor.accumulate_grad: the student's, once installed


def scale_head(a, c: float):
    """An op: out = c · a on the first 4 elements, 0 elsewhere; da = c · dout there. Its value is a
    view and its grad a fresh array of zero pages, so each grad costs address space, not time."""
    value = np.broadcast_to(np.float64(0), a.shape)

    def _backward(out, saved):
        g = np.zeros(a.shape)  # zero pages: only the first is touched
        g[:4] = c * out.grad[:4]
        return (g,)
    return tensor.make_output(value, "scale_head", (a,), _backward)


def sin_head(a):
    """An op: out = sin(a) + 1/2 on the first 4 elements, 0 elsewhere (zero pages: address space,
    not time); da = cos(a) · dout there, so backward reads a's value."""
    value = np.zeros(a.shape)
    value[:4] = np.sin(a.value[:4]) + 0.5

    def _backward(out, saved):
        g = np.zeros(a.shape)
        g[:4] = np.cos(saved[a][:4]) * out.grad[:4]
        return (g,)
    return tensor.make_output(value, "sin_head", (a,), _backward, saves=(a,))


def weighted_head(a, w):
    """An op: out = Σ w · a[:4], a scalar; da = w · dout on the first 4 elements, 0 elsewhere."""

    def _backward(out, saved):
        g = np.zeros(a.shape)
        g[:4] = w * out.grad
        return (g,)
    return tensor.make_output(np.float64(0), "weighted_head", (a,), _backward)
