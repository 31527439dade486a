"""The lab's matrix product: a large one cut into blocks of rows, columns or stacked matrices,
one BLAS call a step on one BLAS thread, the blocks dealt to the lab's threads."""
from __future__ import annotations

import math

import numpy as np

from . import threads


def matmul(x: np.ndarray, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """np.matmul(x, y, out=out), a large product in ``ProductBlocks`` on the lab's threads."""
    blocks = product_blocks(x, y)
    if blocks is None:
        if out is None and x.ndim <= 2 and y.ndim <= 2:
            return x.dot(y)  # for 1-D and 2-D operands np.dot is np.matmul (to rounding) with less set-up
        return np.matmul(x, y, out=out)
    product = np.empty(x.shape[:-1] + y.shape[-1:], np.result_type(x, y)) if out is None else out
    threads.in_blocks(blocks(product), len(blocks), blocks.multiply_adds, threads.MIN_PRODUCT,
                      blas=True, align=blocks.align)
    return product


class ProductBlocks:
    """A product worth sharing among threads, as items to deal out: the matrices of a stack (any
    strides: no reshape copies), or the rows of a matrix product (its columns if it has few rows)
    in ``align`` steps, one BLAS call a step. A step's size depends on the shape alone, so the
    calls are the same for any number of threads: BLAS's kernels take rows and columns in groups
    whose sums may round differently at a block's edge, so the edges must not move with them."""

    def __init__(self, x: np.ndarray, y: np.ndarray, multiply_adds: int) -> None:
        self.x, self.y, self.multiply_adds = x, y, multiply_adds
        self.lead = x.shape[:-2]
        self.by_rows = bool(self.lead) or x.shape[0] >= 2 * STEP_MIN
        steps = -(-len(self) // STEPS)  # items a step, before rounding up to a multiple of STEP_MIN
        self.align = 1 if self.lead else -(-steps // STEP_MIN) * STEP_MIN

    def __len__(self) -> int:
        if self.lead:
            return math.prod(self.lead)
        return self.x.shape[0] if self.by_rows else self.y.shape[1]

    def __call__(self, product: np.ndarray):
        """The function computing items start..stop-1 of ``product`` (the product's own buffer)."""
        x, y, step = self.x, self.y, self.align
        out = product.reshape(x.shape[:-1] + y.shape[-1:])  # fresh, so a view
        if self.lead:
            def matrices(start: int, stop: int) -> None:
                for i in range(start, stop):
                    at = np.unravel_index(i, self.lead)
                    np.matmul(x[at], y if y.ndim == 2 else y[at], out=out[at])
            return matrices
        if self.by_rows:
            def rows(start: int, stop: int) -> None:
                for a in range(start, stop, step):
                    np.matmul(x[a:min(a + step, stop)], y, out=out[a:min(a + step, stop)])
            return rows

        def columns(start: int, stop: int) -> None:
            for a in range(start, stop, step):
                np.matmul(x, y[:, a:min(a + step, stop)], out=out[:, a:min(a + step, stop)])
        return columns


# A matrix product is cut into STEPS steps of a multiple of STEP_MIN rows (or columns): fewer BLAS
# calls repack the other operand less often, more let more threads share it; one step a core, 2 to
# 4 (docs/lab.md, "Product blocks"). The steps depend on the machine and the shape, never on
# set_workers: the bits stay the same for any number of workers.
STEPS = min(4, max(2, threads.cores()))
STEP_MIN = 64


def product_blocks(x: np.ndarray, y: np.ndarray) -> ProductBlocks | None:
    """A large product's blocks; None for a small one, a vector, a stack whose dimensions
    broadcast, a GPU array, or without threadpoolctl (BLAS shares the product among its own threads)."""
    multiply_adds = x.size * y.shape[-1]  # rows of x · K · N
    if multiply_adds < threads.MIN_PRODUCT:  # first, as the cheapest test
        return None
    if type(x) is not np.ndarray or type(y) is not np.ndarray or x.ndim < 2 or y.ndim < 2 \
            or not threads.have_threadpoolctl():
        return None
    if (x.ndim == 2 and y.ndim != 2) or (x.ndim > 2 and y.ndim != 2 and x.shape[:-2] != y.shape[:-2]):
        return None
    return ProductBlocks(x, y, multiply_adds)
