import gc

import numpy as np
import pytest

import ag


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _clean_engine_state():
    """Every test starts with grad enabled, lazy grads, no trace running, and no garbage."""
    gc.collect()
    yield
    if ag.trace.is_tracing():
        ag.trace.end_trace()
    assert ag.config.grad_enabled and not ag.config.eager_grads
