"""The two eager recorders (direct webgpu.h calls and wgpu-py's methods): dispatches, copies, writes and reads
in order, timed passes and profiles, and a bad dispatch that raises and leaves the next op working."""
import numpy as np
import pytest

from tinynn_gpu.runtime import kernels
from tinynn_gpu.runtime.webgpu import wgpu


WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wg: vec3<u32>) { out[0] = 1.0; }
"""


@pytest.fixture(params=["direct", "methods"])
def eager_path(request, gpu):
    """A test run with the eager recorder on direct wgpu-native calls, then on wgpu-py's methods."""
    rt = gpu.rt
    calls, reason, threaded = rt.native, rt.native_reason, rt.record_thread is not None
    assert calls is not None, f"the direct path should work on {gpu.device_name}: {reason}"
    rt.use_native(calls if request.param == "direct" else None, reason or "switched off by the test", threaded)
    yield request.param
    rt.use_native(calls, reason, threaded)


def test_both_eager_paths_record_dispatches_copies_writes_and_reads_in_order(gpu, eager_path):
    rt = gpu.rt
    a = rt.empty((6,))
    rt.write(a, np.arange(6, dtype=np.float32))  # staged: copied in by the encoder this dispatch opens
    doubled = gpu.binary("add", a, a)
    kept = rt.copy(doubled)  # ends the pass: a copy between dispatches
    rt.write(a, np.ones(6, np.float32))  # staged behind the open encoder's commands
    summed = gpu.binary("add", kept, a)
    assert rt.recording.encoder is not None
    out = np.empty(3, np.float32)
    assert rt.read(summed, out, start=3).tolist() == [7.0, 9.0, 11.0] and rt.recording.encoder is None
    assert gpu.to_numpy(doubled).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert gpu.to_numpy(a).tolist() == [1.0] * 6


def test_both_eager_paths_time_passes_and_profile_each_dispatch(gpu, eager_path):
    rt = gpu.rt
    a = gpu.from_numpy(np.arange(256, dtype=np.float32))
    assert rt.time_pass(lambda: gpu.binary("add", a, a), reps=3) > 0 and rt.recording.compute_pass is None
    rows = rt.profile(lambda: gpu.to_numpy(gpu.binary("mul", gpu.binary("add", a, a), a)))
    assert [row["calls"] for row in rows] == [2] and rows[0]["ms"] > 0


def test_both_eager_paths_raise_a_bad_dispatch_and_then_work(gpu, eager_path):
    """wgpu-native reports a dispatch past the workgroup limit when the pass ends: the error must raise, and
    leave no half-used encoder behind for the next op."""
    rt = gpu.rt
    out = rt.empty((4,))
    with pytest.raises(wgpu.GPUError, match="65535"):
        rt.dispatch(rt.shader(WGSL, "one"), "main", (kernels.MAX_GROUPS + 1, 1, 1), {"out": out})
        rt.flush()
    assert rt.recording.encoder is None and rt.recording.compute_pass is None
    rt.dispatch(rt.shader(WGSL, "one"), "main", 1, {"out": out})
    assert gpu.to_numpy(out)[0] == 1.0
