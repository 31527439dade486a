"""Tensor and sequence parallelism across real MPI processes (mpiexec -n 1, 2, 4).

CI installs the ``mpi`` extra (mpi4py and MPICH from PyPI) and sets AG_REQUIRE_MPI=1, so a
missing MPI fails the run there instead of skipping.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ag import parallel


def _mpiexec() -> str | None:
    beside_python = Path(sys.executable).parent / "mpiexec"
    return str(beside_python) if beside_python.exists() else shutil.which("mpiexec")


def _require_mpi() -> str:
    mpiexec = _mpiexec()
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        if os.environ.get("AG_REQUIRE_MPI"):
            pytest.fail("AG_REQUIRE_MPI is set but mpi4py or mpiexec is missing: pip install '.[mpi]'")
        pytest.skip("needs mpi4py and mpiexec: pip install '.[mpi]'")
    return mpiexec


def run_ranks(n: int, *args: str, module: str = "ag.parallel") -> dict:
    """``mpiexec -n n python -m module --json args``: rank 0's JSON."""
    mpiexec = _require_mpi()
    result = subprocess.run([mpiexec, "-n", str(n), sys.executable, "-m", module, "--json", *args],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"mpiexec -n {n} failed:\n{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_parallel_gradients_equal_one_process(ranks):
    result = run_ranks(ranks, "--check")
    assert result["ranks"] == ranks
    rows = result["rows"]
    assert {(r["sequence_parallel"], r["granularity"]) for r in rows} == {
        (sp, g) for sp in (False, True) for g in (None, "selective", "full")}
    for row in rows:
        assert row["max_relative_error"] < 1e-12, row


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_each_rank_keeps_exactly_the_formulas_bytes(ranks):
    rows = run_ranks(ranks)["rows"]
    assert len(rows) >= 12
    for row in rows:
        assert row["measured"] == [row["formula"]] * ranks, row


@pytest.mark.slow
def test_sequence_parallelism_divides_every_activation_by_t():
    """sbh/t · (34 + 5as/h) on each of 2 ranks: half of one process's bytes."""
    two = {(r["s"], r["b"], r["h"], r["a"], r["granularity"]): r["measured"]
           for r in run_ranks(2)["rows"] if r["sequence_parallel"]}
    for (s, b, h, a, granularity), measured in two.items():
        if granularity is None and a == 4 and h == 64:
            assert measured == [s * b * h * (34 + 5 * a * s // h) // 2] * 2


def _fake_group(size: int, rank: int = 0):
    return SimpleNamespace(size=size, rank=rank)


def test_heads_not_divisible_by_the_ranks_are_refused():
    with pytest.raises(ValueError, match=r"3 ranks must divide num_heads 4"):
        parallel.ParallelTransformerLayer(32, 4, _fake_group(3))


def test_mqa_cannot_be_split_across_ranks():
    with pytest.raises(ValueError, match=r"2 ranks must divide num_heads 4 and the 1 key/value groups"):
        parallel.ParallelTransformerLayer(32, 4, _fake_group(2), num_query_groups=1)


def test_shards_of_one_layer_cover_its_weights_exactly():
    """The two ranks' column slices of the QKV weight, side by side, are the whole weight."""
    from ag import nn
    full = nn.TransformerLayer(32, 4, num_query_groups=2, seed=1)
    shards = [parallel.ParallelTransformerLayer(32, 4, _fake_group(2, r), num_query_groups=2, seed=1)
              for r in range(2)]
    q = np.concatenate([s.attention.qkv.weight.value[:, :16] for s in shards], axis=1)
    np.testing.assert_array_equal(q, full.attention.qkv.weight.value[:, :32])
    fc2 = np.concatenate([s.fc2_weight.value for s in shards], axis=0)
    np.testing.assert_array_equal(fc2, full.mlp.fc2.weight.value)
