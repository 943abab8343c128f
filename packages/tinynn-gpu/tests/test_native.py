"""The direct wgpu-native calls: the start-up probe refuses a path that does not work, a validation error
still raises through them, a replay's chunks and its result copy are laid out as intended, and a replay
left with the submit thread reaches the queue before anything after it."""
import gc
import threading

import numpy as np
import pytest
import wgpu

import tinynn

from tinynn_gpu import native, replay, runtime

WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wg: vec3<u32>) { out[0] = 1.0; }
"""


def test_the_probe_refuses_a_path_that_does_not_work(gpu):
    class Broken(native.NativeCalls):
        __slots__ = ()

        def record(self, compute_pass, runs):  # records nothing: the probe's buffer keeps what was written
            pass

    class Missing(native.NativeCalls):
        __slots__ = ()

        def __init__(self, *args):
            raise AttributeError("wgpuComputePassEncoderDispatchWorkgroups")
    plain = native.NativeCalls
    try:
        native.NativeCalls = Broken
        calls, reason = native.probe(gpu.rt.device)
        assert calls is None and "wrote [10.0, 10.0, 10.0, 10.0]" in reason
        native.NativeCalls = Missing
        calls, reason = native.probe(gpu.rt.device)
        assert calls is None and "not reachable" in reason
    finally:
        native.NativeCalls = plain
    calls, reason = native.probe(gpu.rt.device)
    assert calls is not None and reason == ""


@pytest.mark.parametrize("threaded", [False, True])
def test_a_validation_error_raises_through_the_direct_calls(gpu, threaded):
    """wgpu-native reports a bad dispatch when the pass ends or the encoder finishes: it must raise in the
    caller, as it does through wgpu-py's methods, not only be logged (from the worker thread too)."""
    rt, calls = gpu.rt, gpu.rt.native
    assert calls is not None, gpu.rt.native_reason
    submitter = native.Submitter(calls) if threaded else calls
    out = rt.empty((4,))
    pipe = rt.pipeline(rt.shader(WGSL, "one"), "main")
    group = rt.bind_group(pipe, (0,), [out.buffer])

    def submit(groups):
        encoder, compute_pass = calls.begin()
        calls.record(compute_pass, [(pipe._internal, [(group._internal, groups, 1, 1)])])
        submitter.submit(encoder, compute_pass)
        if threaded:
            submitter.wait()
    with pytest.raises(wgpu.GPUError, match="65535"):
        submit(runtime.MAX_GROUPS + 1)
    submit(1)  # the device still works
    assert gpu.to_numpy(out)[0] == 1.0


def test_a_read_back_that_cannot_map_raises_rather_than_waits(gpu):
    """A map refused at once (a destroyed buffer) raises wgpu's error; a map whose callback never comes (here:
    one that ignores it) raises once the queue is idle, instead of polling forever."""
    from wgpu.backends.wgpu_native import ffi, lib
    from wgpu.backends.wgpu_native._api import libf

    calls = gpu.rt.native
    assert calls is not None, gpu.rt.native_reason
    usage = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
    gone = gpu.rt.device.create_buffer(size=16, usage=usage)
    gone.destroy()
    with pytest.raises(wgpu.GPUError, match="destroyed"):
        calls.read(gone._internal, [(0, np.zeros(4, np.float32))])

    class Deaf(native.NativeCalls):
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
    rt._copy(src.buffer, 0, staging, 0, 32)
    rt.flush()
    head, tail = np.zeros(3, np.float32), np.zeros(2, np.float32)
    calls.read(staging._internal, [(0, head), (24, tail)])
    assert head.tolist() == [0, 1, 2] and tail.tolist() == [6, 7]


class Handle:
    """A stand-in for a wgpu object: what direct calls take is its `_internal`."""
    def __init__(self, name):
        self._internal = name


@pytest.mark.parametrize("direct", [True, False])
def test_a_replay_grows_its_chunks_and_submits_before_each_write(direct, monkeypatch):
    monkeypatch.setattr(replay, "FIRST_CHUNK", 8)
    monkeypatch.setattr(replay, "CHUNK_GROWTH", 2)
    pipe, other, group, x, y = map(Handle, ("pipe", "other", "group", "x", "y"))
    dispatches = [("dispatch", other if i == 10 else pipe, group, (i + 1, 1, 1)) for i in range(35)]
    events = [("write", x, b"1", 0)] + dispatches[:30] + [("write", y, b"2", 8)] + dispatches[30:]
    program = replay.compile_program(events, direct)
    name = (lambda h: h._internal) if direct else (lambda h: h)
    assert [kind for kind, _ in program] == ["write", "dispatches", "dispatches", "dispatches", "write", "dispatches"]
    assert program[0][1] == (name(x), b"1", 0) and program[4][1] == (name(y), b"2", 8)
    chunks = [item for kind, item in program if kind == "dispatches"]
    assert [sum(len(d) for _, d in runs) for runs in chunks] == [8, 16, 6, 5]
    assert [(p, len(d)) for p, d in chunks[1]] == [(name(pipe), 2), (name(other), 1), (name(pipe), 13)]
    assert chunks[3][0][1] == [(name(group), x, 1, 1) for x in range(31, 36)]


def test_a_runtimes_worker_thread_ends_with_the_runtime(gpu):
    rt = runtime.Runtime(gpu.ctx)
    if rt.native is None:
        pytest.fail(f"the direct path should work on {gpu.device_name}: {rt.native_reason}")
    rt.use_native(rt.native, "", threaded=True)
    thread = rt.submitter.thread
    assert thread.is_alive()
    del rt
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()


@pytest.mark.parametrize("staged", [True, False])
def test_a_replay_returns_before_the_submit_thread_is_done_and_the_next_write_waits(gpu, monkeypatch, staged):
    """The first chunk goes in at once; the submit thread holds the second (a gate) while the caller writes
    the next input: the write must reach the queue after it, or the replayed step would read that input.
    A small write is staged (a copy in the next submission, which waits for the thread); a large one waits."""
    rt = gpu.rt
    calls, reason, threaded = rt.native, rt.native_reason, rt.submitter is not None
    rt.use_native(calls, reason, threaded=True)
    monkeypatch.setattr(replay, "FIRST_CHUNK", 1)
    if not staged:
        monkeypatch.setattr(runtime, "STAGED_WRITE_BYTES", 0)
    gate, submitted = threading.Event(), []
    submit = native.NativeCalls.submit

    def gated(self, *args):
        if threading.current_thread().name == "tinynn-submit":
            gate.wait(timeout=30)
        submitted.append(threading.current_thread().name)
        return submit(self, *args)
    try:
        x = tinynn.tensor(np.zeros(4), backend=gpu)
        step = gpu.capture(lambda: x * 2.0 + x)  # two dispatches, the second reading x again
        for value in range(4):  # eager calls, then the capture
            gpu.write_(x.data, np.full(4, value, np.float32))
            assert step().numpy().tolist() == [3.0 * value] * 4
        monkeypatch.setattr(native.NativeCalls, "submit", gated)
        gpu.write_(x.data, np.full(4, 10.0, np.float32))
        replayed = step()
        assert step.tape is not None and step.tape.dispatches == 2
        assert submitted == ["MainThread"]  # returned with its second chunk still held
        threading.Timer(0.2, gate.set).start()
        gpu.write_(x.data, np.full(4, 20.0, np.float32))  # staged: recorded, no wait; else waits for the gate
        assert submitted == ["MainThread"] + ["tinynn-submit"] * (not staged)
        assert replayed.numpy().tolist() == [30.0] * 4 and step().numpy().tolist() == [60.0] * 4
    finally:
        gate.set()
        rt.use_native(calls, reason, threaded)


@pytest.fixture(params=["direct", "methods"])
def eager_path(request, gpu):
    """A test run with the eager recorder on direct wgpu-native calls, then on wgpu-py's methods."""
    rt = gpu.rt
    calls, reason, threaded = rt.native, rt.native_reason, rt.submitter is not None
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
    assert rt.encoder is not None
    out = np.empty(3, np.float32)
    assert rt.read(summed, out, start=3).tolist() == [7.0, 9.0, 11.0] and rt.encoder is None
    assert gpu.to_numpy(doubled).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert gpu.to_numpy(a).tolist() == [1.0] * 6


def test_both_eager_paths_time_passes_and_profile_each_dispatch(gpu, eager_path):
    rt = gpu.rt
    a = gpu.from_numpy(np.arange(256, dtype=np.float32))
    assert rt.time_pass(lambda: gpu.binary("add", a, a), reps=3) > 0 and rt.compute_pass is None
    rows = rt.profile(lambda: gpu.to_numpy(gpu.binary("mul", gpu.binary("add", a, a), a)))
    assert [row["calls"] for row in rows] == [2] and rows[0]["ms"] > 0


def test_both_eager_paths_raise_a_bad_dispatch_and_then_work(gpu, eager_path):
    """wgpu-native reports a dispatch past the workgroup limit when the pass ends: the error must raise, and
    leave no half-used encoder behind for the next op."""
    rt = gpu.rt
    out = rt.empty((4,))
    with pytest.raises(wgpu.GPUError, match="65535"):
        rt.dispatch(rt.shader(WGSL, "one"), "main", (runtime.MAX_GROUPS + 1, 1, 1), {0: out})
        rt.flush()
    assert rt.encoder is None and rt.compute_pass is None
    rt.dispatch(rt.shader(WGSL, "one"), "main", 1, {0: out})
    assert gpu.to_numpy(out)[0] == 1.0
