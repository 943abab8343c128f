"""Shared fixtures: `backend` runs a test once per available backend (the CPU reference always; the GPU
backend too when tinynn-gpu is installed; TINYNN_REQUIRE_GPU=1 makes a missing GPU a failure, not a skip)."""
import os
import tempfile

# One BLAS thread unless the caller chose: the tests multiply small matrices, where BLAS's threads cost more
# than they give (the more so on a shared machine), and the MPI tests' ranks, which inherit it, would otherwise
# share the cores with each other's threads. Set before NumPy loads.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402 (after the thread count, which NumPy's BLAS reads when it loads)
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from tinynn import registry  # noqa: E402


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


@pytest.fixture
def workdir(tmp_path, monkeypatch, request):
    """A fresh working folder holding data.txt (the test module's TEXT, else a short sentence repeated), on the CPU.
    It is the temporary folder too: a checkpoint rescued from a full disk goes there, not into the machine's /tmp."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TINYNN_DEVICE", "cpu")
    text = getattr(request.module, "TEXT", "The quick brown fox jumps over the lazy dog. " * 40)
    (tmp_path / "data.txt").write_text(text)
    return tmp_path
