import numpy as np
import pytest

import ag


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _clean_engine_state():
    """Every test leaves grad enabled, lazy grads and no trace running behind it."""
    yield
    if ag.trace.is_tracing():
        ag.trace.end_trace()
    assert ag.config.grad_enabled and not ag.config.eager_grads


@pytest.fixture(scope="module", params=["classroom", "lab"])
def each_path(request):
    """A test module's tests twice: on the classroom path (the default) and with ``ag.lab`` on, its
    thresholds down to 1 and two workers, so that even small arrays are shared in blocks."""
    if request.param == "classroom":
        assert not ag.lab.enabled(), "the lab was left on"
        yield request.param
        return
    patch = pytest.MonkeyPatch()
    patch.setattr(ag.lab.threads, "MIN_PASS", 1)
    patch.setattr(ag.lab.threads, "MIN_PRODUCT", 1)
    previous = ag.lab.set_workers(2)
    try:
        with ag.lab.on():
            yield request.param
    finally:
        ag.lab.set_workers(previous)
        patch.undo()


@pytest.fixture
def torch_or_skip():
    """torch, or a skip; CI sets AG_REQUIRE_TORCH=1 so that a missing torch fails instead."""
    import os
    if os.environ.get("AG_REQUIRE_TORCH") is None:
        return pytest.importorskip("torch")
    import torch
    return torch


# Under pytest-xdist (the test extra; pyproject's addopts: -n auto --dist loadgroup) each group's
# files run one after another on one worker, while the other tests share the other cores:
# - the red team and the Gradescope chroot watch the whole machine (its disks' usage, the
#   processes left behind) and build a Debian root;
# - the notebooks' Jupyter kernels each take free TCP ports on localhost when they start;
# - test_remat_graph's module fixtures and its memo of HiGHS' answers serve one process.
XDIST_GROUPS = {"test_redteam.py": "machine-wide", "test_redteam_intake.py": "machine-wide",
                "test_gradescope_chroot.py": "machine-wide", "test_sandbox.py": "machine-wide",
                "test_redteam_sandbox.py": "machine-wide", "test_redteam_judge.py": "machine-wide",
                "test_redteam_work.py": "machine-wide",
                "test_notebooks.py": "jupyter-kernels", "test_notebook_assign.py": "jupyter-kernels",
                "test_remat_graph.py": "remat-graph"}


def pytest_collection_modifyitems(items):
    for item in items:
        group = XDIST_GROUPS.get(item.path.name)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


# The graded tests run under the judge (`ag grade`), which test_course.py and test_redteam.py drive.
collect_ignore = ["grading"]
