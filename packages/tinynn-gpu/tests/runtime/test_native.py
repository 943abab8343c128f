"""The direct webgpu.h calls: the start-up probe refuses a path that does not work, a validation error still
raises through them (from the recording thread too), and their read-back maps, waits and fills each part."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tinynn_gpu.runtime import kernels, native, webgpu
from tinynn_gpu.runtime.webgpu import wgpu


WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wg: vec3<u32>) { out[0] = 1.0; }
"""


def test_the_probe_refuses_a_path_that_does_not_work(gpu, monkeypatch):
    implementation = webgpu.chosen()

    class Broken(implementation.Calls):
        __slots__ = ()

        def record(self, compute_pass, runs):  # records nothing: the probe's buffer keeps what was written
            pass

    class Missing(implementation.Calls):
        __slots__ = ()

        def __init__(self, *args):
            raise AttributeError("wgpuComputePassEncoderDispatchWorkgroups")
    with monkeypatch.context() as patch:
        patch.setattr(type(implementation), "Calls", Broken)
        calls, reason = native.probe(gpu.rt.device)
        assert calls is None and "wrote [10.0, 10.0, 10.0, 10.0]" in reason
        patch.setattr(type(implementation), "Calls", Missing)
        calls, reason = native.probe(gpu.rt.device)
        assert calls is None and f"{implementation.name}'s cffi functions are not reachable" in reason
    calls, reason = native.probe(gpu.rt.device)
    assert calls is not None and reason == "" and type(calls) is implementation.Calls


@pytest.mark.parametrize("threaded", [False, True])
def test_a_validation_error_raises_through_the_direct_calls(gpu, threaded):
    """wgpu-native reports a bad dispatch when the pass ends or the encoder finishes: it must raise in the
    caller, as it does through wgpu-py's methods, not only be logged (from a worker thread too)."""
    rt, calls = gpu.rt, gpu.rt.native
    assert calls is not None, gpu.rt.native_reason
    out = rt.empty((4,))
    launch = rt.prepare(rt.shader(WGSL, "one"), "main", 1, ("out",))
    pipe, group = launch.pipeline, rt.kernels.bind_group((launch, out.buffer))

    def record(groups):
        encoder, compute_pass = calls.begin()
        calls.record(compute_pass, [(pipe._internal, [(group._internal, groups, 1, 1)])])
        return calls.finish(encoder, compute_pass)

    def submit(groups):
        if threaded:
            with ThreadPoolExecutor(1) as worker:
                calls.submit([worker.submit(record, groups).result()])
        else:
            calls.submit([record(groups)])
    with pytest.raises(wgpu.GPUError, match="65535"):
        submit(kernels.MAX_GROUPS + 1)
    submit(1)  # the device still works
    assert gpu.to_numpy(out)[0] == 1.0


def test_a_read_back_that_cannot_map_raises_rather_than_waits(gpu):
    """A map refused at once (a destroyed buffer) raises wgpu's error; a map whose callback never comes (here:
    one that ignores it) raises once the queue is idle (wgpu-native) or its future is done (Dawn), instead of
    waiting forever."""
    implementation = webgpu.chosen()
    ffi, lib, libf = implementation.cffi()

    calls = gpu.rt.native
    assert calls is not None, gpu.rt.native_reason
    usage = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
    gone = gpu.rt.device.create_buffer(size=16, usage=usage)
    gone.destroy()
    with pytest.raises(wgpu.GPUError, match="destroyed"):
        calls.read(gone._internal, [(0, np.zeros(4, np.float32))])

    class Deaf(implementation.Calls):
        __slots__ = ("_ignore",)

        def __init__(self, *args):
            super().__init__(*args)
            self._ignore = ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)",
                                        lambda *_: None)
            self._map_callback = ffi.new("WGPUBufferMapCallbackInfo *", {
                "mode": lib.WGPUCallbackMode_AllowProcessEvents, "callback": self._ignore})
    deaf = Deaf(ffi, lib, libf, gpu.rt.device)
    buffer = gpu.rt.device.create_buffer(size=16, usage=usage)
    with pytest.raises(RuntimeError, match="never completed"):
        deaf.read(buffer._internal, [(0, np.zeros(4, np.float32))])


def test_a_read_back_fills_each_part_from_its_offset(gpu):
    calls, rt = gpu.rt.native, gpu.rt
    assert calls is not None, rt.native_reason
    src = gpu.from_numpy(np.arange(8, dtype=np.float32))
    staging = rt.device.create_buffer(size=32, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    rt.recording.copy(src.buffer, 0, staging, 0, 32)
    rt.flush()
    head, tail = np.zeros(3, np.float32), np.zeros(2, np.float32)
    calls.read(staging._internal, [(0, head), (24, tail)])
    assert head.tolist() == [0, 1, 2] and tail.tolist() == [6, 7]


def test_a_read_back_whose_callback_is_interrupted_raises_the_interrupt_and_unmaps(gpu):
    """Ctrl-C lands inside the map's callback (Python code run by the device's poll): the read finishes, unmaps
    its buffer, and raises KeyboardInterrupt, not "the map never completed (was the device lost?)"; the buffer
    reads again afterwards."""
    calls, rt = gpu.rt.native, gpu.rt
    assert calls is not None, rt.native_reason
    src = gpu.from_numpy(np.arange(4, dtype=np.float32))
    staging = rt.device.create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    class CtrlCOnce(list):
        def __setitem__(self, i, value):
            if i == 1 and not getattr(self, "fired", False):
                self.fired = True
                raise KeyboardInterrupt
            super().__setitem__(i, value)
    status = calls._map_status
    calls._map_status = CtrlCOnce(status)
    try:
        for interrupted in (True, False):
            rt.recording.copy(src.buffer, 0, staging, 0, 16)
            rt.flush()
            out = np.zeros(4, np.float32)
            if interrupted:
                with pytest.raises(KeyboardInterrupt):
                    calls.read(staging._internal, [(0, out)])
            else:
                calls.read(staging._internal, [(0, out)])
            assert out.tolist() == [0, 1, 2, 3]
    finally:
        calls._map_status = status
