"""Fixtures for the GPU tests. They run on whatever adapter the WebGPU implementation finds (lavapipe in CI), on
wgpu-native or, with TINYNN_WEBGPU=dawn, on Dawn. With TINYNN_REQUIRE_GPU=1 (set by `nox -s tests-gpu`) a missing
adapter fails the run instead of skipping it."""
import os

import numpy as np
import pytest
from hypothesis import settings

from tinynn import registry
from tinynn_gpu.runtime import runtime
from tinynn_gpu.ops import group_sum
from tinynn_gpu.runtime import settings as gpu_settings


# CI draws the same examples on every run, so a submission passes or fails on its code, not on the draw;
# elsewhere each run draws fresh ones.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def gpu():
    try:
        return registry.select("gpu")
    except Exception as e:
        if os.environ.get("TINYNN_REQUIRE_GPU") == "1":
            pytest.fail(f"TINYNN_REQUIRE_GPU=1 but the GPU backend is unusable: {e}")
        pytest.skip(f"no usable GPU backend: {e}")


@pytest.fixture
def poisoned(gpu, monkeypatch):
    """Every array the GPU backend allocates starts as NaN, so an element a kernel fails to write shows. And
    after the test, the rest of each live array's buffer (the pool rounds sizes up) must still be NaN, so a
    kernel that writes past an array's end shows too: shaders run without wgpu's bounds checks (unchecked.py).
    The fixture holds every such array until then (a test's arrays are small), so none goes back to the pool."""
    plain_empty = runtime.Runtime.empty
    made = []

    def empty(self, shape, dtype=np.float32):
        arr = plain_empty(self, shape, dtype)
        if arr.dtype == np.float32 and arr.buffer is not None:
            n = arr.buffer.size // 4
            self.dispatch("elementwise", "fill_main", -(-n // 256), {"out": arr}, {"n": n, "value": float("nan")})
            made.append((self, arr))  # the lesson's NumPy entries have a runtime of their own
        return arr
    monkeypatch.setattr(runtime.Runtime, "empty", empty)
    monkeypatch.setattr(gpu, "_empty", gpu.rt.empty)  # the backend's own reference, bound before the patch
    yield gpu
    for rt, arr in made:
        if arr.buffer.size > arr.nbytes:
            rt.flush()
            tail = np.frombuffer(rt.device.queue.read_buffer(arr.buffer, arr.nbytes), np.float32)
            assert np.isnan(tail).all(), f"a kernel wrote past the end of a {arr.shape} array"


@pytest.fixture
def setting(monkeypatch):
    """setting(name, value): a TINYNN_ variable set (None: unset) for the test and read into the package's settings
    (runtime/settings.py), which read the environment once; both restored after it."""
    def set_(name, value):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
        gpu_settings.reload()
    yield set_
    monkeypatch.undo()
    gpu_settings.reload()


@pytest.fixture
def rng(request):
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(params=["subgroup", "workgroup", "workgroup, teams of 64"])
def subgroup_path(request, poisoned, monkeypatch):
    """The poisoned GPU backend with its kernels forced onto their subgroup path or onto the one that needs
    none (workgroup-memory sums; attention's one thread per row): TINYNN_SUBGROUPS. Teams of 64 threads give
    the row-team kernels (group_sum.py) two rows a team, as a 64-wide subgroup would (lavapipe's are 8)."""
    if request.param == "subgroup" and not poisoned.ctx.subgroups:  # the device's feature, by either one's name
        pytest.skip("the adapter has no subgroup operations")
    monkeypatch.setattr(poisoned.rt, "subgroups", request.param == "subgroup")  # TINYNN_SUBGROUPS, read at start
    if request.param.endswith("64"):
        monkeypatch.setattr(group_sum, "TEAM_WIDTH", 64)
    return poisoned
