"""Direct wgpu-native calls for the three commands every dispatch records: set pipeline, set bind group,
dispatch.

wgpu-py's pass-encoder methods wrap each C function in Python (argument checks, an error-capture frame):
on the H200 a dispatch recorded through them costs ~3.9 us of host time, the same C functions called
straight through cffi ~1.2 us. They take each wgpu object's `_internal` handle, which is private to
wgpu-py (pinned at 0.32.0). So `probe` checks at start-up that the functions and handles exist and that
one test dispatch through them writes what it should; when anything fails, the runtime records through
wgpu-py's methods and `tinynn info` says why (`Runtime.describe`).

Only the per-dispatch commands go direct. Encoders and passes are still created, ended, finished and
submitted through wgpu-py, which releases their native handles and raises any validation error that
wgpu-native deferred to `finish`.
"""
from __future__ import annotations

import numpy as np

PROBE_WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wg: vec3<u32>) { out[wg.x] = f32(wg.x) + 1.0; }
"""


class NativeCalls:
    """The C functions a compute pass records with, and the NULL the bind-group call wants for its
    (absent) dynamic offsets."""
    __slots__ = ("set_pipeline", "set_bind_group", "dispatch", "null")

    def __init__(self, ffi, lib):
        self.set_pipeline = lib.wgpuComputePassEncoderSetPipeline
        self.set_bind_group = lib.wgpuComputePassEncoderSetBindGroup
        self.dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
        self.null = ffi.NULL


def probe(device) -> tuple[NativeCalls | None, str]:
    """(the direct calls, "") when they work on this device, else (None, why not)."""
    try:
        from wgpu.backends.wgpu_native import ffi, lib
        calls = NativeCalls(ffi, lib)
    except (ImportError, AttributeError) as e:
        return None, f"wgpu-native's cffi functions are not reachable ({type(e).__name__}: {e})"
    import wgpu
    try:
        n = 4
        buffer = device.create_buffer(size=4 * n, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        module = device.create_shader_module(label="native probe", code=PROBE_WGSL)
        pipe = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        group = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": buffer, "offset": 0, "size": 4 * n}}])
        encoder = device.create_command_encoder()
        compute_pass = encoder.begin_compute_pass()
        handle = compute_pass._internal
        calls.set_pipeline(handle, pipe._internal)
        calls.set_bind_group(handle, 0, group._internal, 0, calls.null)
        calls.dispatch(handle, n, 1, 1)
        compute_pass.end()
        device.queue.submit([encoder.finish()])
        got = np.frombuffer(device.queue.read_buffer(buffer), np.float32)
    except Exception as e:  # any failure means: record through wgpu-py's methods instead
        return None, f"a test dispatch through wgpu-native's C functions failed ({type(e).__name__}: {e})"
    if not np.array_equal(got, np.arange(1, n + 1, dtype=np.float32)):
        return None, f"a test dispatch through wgpu-native's C functions wrote {got.tolist()}, not [1, 2, 3, 4]"
    return calls, ""
