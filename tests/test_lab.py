"""ag.lab, the opt-in lab: one switch (a function, a context manager, AG_LAB), plugged into the
ops' seams (ag.ops.kernels) and out again; its own kernels (the short sum)."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import ag
from ag.lab import seams
from ag.ops import kernels


def test_the_classroom_path_is_the_default_and_every_seam_holds_the_classroom_kernel():
    assert not ag.lab.enabled()
    for name in seams.names():
        assert getattr(kernels.KERNELS, name) is seams.classroom_kernel(name), name
    assert kernels.KERNELS.matmul is np.matmul


def test_enable_puts_a_variant_into_every_seam_and_disable_takes_each_out():
    ag.lab.enable()
    try:
        assert ag.lab.enabled()
        swapped = [n for n in seams.names() if getattr(kernels.KERNELS, n) is not seams.classroom_kernel(n)]
        assert swapped == list(seams.names())
    finally:
        ag.lab.disable()
    assert not ag.lab.enabled()
    assert all(getattr(kernels.KERNELS, n) is seams.classroom_kernel(n) for n in seams.names())


def test_on_switches_the_lab_on_inside_the_block_and_back_after_even_on_an_error():
    with pytest.raises(RuntimeError, match="inside"):
        with ag.lab.on():
            assert ag.lab.enabled()
            raise RuntimeError("inside")
    assert not ag.lab.enabled()


def test_on_inside_an_enabled_lab_leaves_it_on():
    ag.lab.enable()
    try:
        with ag.lab.on():
            pass
        assert ag.lab.enabled()
    finally:
        ag.lab.disable()


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("", False)])
def test_ag_lab_in_the_environment_switches_the_lab_at_import(value, on):
    out = subprocess.run([sys.executable, "-c", "import ag; print(ag.lab.enabled())"], capture_output=True,
                         text=True, check=True, env={**os.environ, "AG_LAB": value}).stdout.strip()
    assert out == str(on)


def test_an_ag_lab_that_is_neither_1_nor_0_is_refused_with_a_sentence():
    run = subprocess.run([sys.executable, "-c", "import ag"], capture_output=True, text=True,
                         env={**os.environ, "AG_LAB": "yes"})
    assert run.returncode != 0
    assert "AG_LAB must be 1 (the lab on) or 0 (off), got 'yes'" in run.stderr


def test_swap_refuses_a_seam_that_does_not_exist_and_names_the_seams():
    with pytest.raises(KeyError, match="no seam named relu_fast; the seams are .*matmul"):
        seams.swap({"relu_fast": np.maximum})
    assert not ag.lab.enabled()


def test_set_workers_is_the_labs():
    assert ag.set_workers is ag.lab.set_workers is ag.lab.threads.set_workers


def test_with_the_lab_on_a_large_product_runs_in_blocks_and_equals_the_classroom_product_to_rounding(monkeypatch):
    calls = []
    real = ag.lab.threads.in_blocks
    monkeypatch.setattr(ag.lab.threads, "in_blocks", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    x = np.random.default_rng(0).standard_normal((1024, 512)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
    classroom = ag.matmul(ag.Tensor(x), ag.Tensor(w)).value
    assert calls == []
    with ag.lab.on():
        lab = ag.matmul(ag.Tensor(x), ag.Tensor(w)).value
    assert calls, "the lab's product did not run in blocks"
    np.testing.assert_allclose(lab, classroom, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_labs_short_vector_sum_is_its_dot_product_with_ones_within_the_rounding_bound(dtype):
    """Up to 64 elements, the lab's sum adds one element after another (BLAS's dot with ones), not in
    NumPy's pairwise order: the result is within (n - 1)·eps·Σ|x| of the exact sum (math.fsum) and
    equals the dot product it is said to be; from 65 elements on it is NumPy's sum again."""
    rng = np.random.default_rng(3)
    eps = np.finfo(dtype).eps
    assert ag.lab.passes.DOT_SUM_MAX == 64
    with ag.lab.on():
        for n in range(0, ag.lab.passes.DOT_SUM_MAX + 2):
            x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dtype)
            got = ag.sum(ag.Tensor(x)).value
            assert type(got) is np.ndarray and got.shape == () and got.dtype == dtype
            exact = math.fsum(x.astype(np.float64))
            assert abs(float(got) - exact) <= max(n - 1, 0) * eps * float(np.abs(x.astype(np.float64)).sum())
            assert got == (x.dot(np.ones(n, dtype)) if n <= ag.lab.passes.DOT_SUM_MAX else x.sum())
        for values, expected in [([np.inf, 1.0], np.inf), ([np.inf, -np.inf], np.nan), ([np.nan, 1.0], np.nan),
                                 ([-0.0, -0.0], 0.0), ([], 0.0)]:
            with np.errstate(invalid="ignore"):  # inf - inf warns, in NumPy's sum as in its dot
                got = ag.sum(ag.Tensor(np.array(values, dtype))).value
            np.testing.assert_array_equal(got, np.array(expected, dtype))


def test_the_classroom_sum_is_numpys_pairwise_sum_bit_for_bit_where_the_labs_is_a_dot():
    x = (np.random.default_rng(5).standard_normal(64) * 10.0 ** np.arange(-3, 61) % 7).astype(np.float32)
    assert ag.sum(ag.Tensor(x)).value == x.sum()
