"""Shared fixtures: `backend` runs a test once per available backend (the CPU reference always; the GPU
backend too when tinynn-gpu is installed; TINYNN_REQUIRE_GPU=1 makes a missing GPU a failure, not a skip)."""
import os

import numpy as np
import pytest
from hypothesis import settings

from tinynn import registry


def _backend_names():
    names = ["cpu"]
    if registry.discovered() or os.environ.get("TINYNN_REQUIRE_GPU") == "1":
        names.append("gpu")
    return names


# CI draws the same examples on every run, so a submission passes or fails on its code, not on the draw;
# elsewhere each run draws fresh ones.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(params=_backend_names())
def backend(request):
    if request.param == "cpu":
        return registry.reference()
    try:
        return registry.select("gpu")
    except Exception as e:
        if os.environ.get("TINYNN_REQUIRE_GPU") == "1":
            pytest.fail(f"TINYNN_REQUIRE_GPU=1 but no GPU backend is usable: {e}")
        pytest.skip(f"no usable GPU backend: {e}")


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: fresh shapes per test, the same on every run."""
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
