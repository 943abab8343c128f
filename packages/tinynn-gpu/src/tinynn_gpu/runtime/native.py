"""Direct webgpu.h calls for recording, into wgpu-native or Dawn (both implement webgpu.h, and the structs and
functions used here are laid out alike in both headers): the three commands every dispatch records (set
pipeline, set bind group, dispatch), and the few per submission (encoder, pass, copy, query resolve, finish,
submit, and `write_buffer`), used by the replay of a captured step and by the runtime's eager recorder; and the
read-back's map, copy and unmap.

wgpu-py's methods wrap each C function in Python (argument checks, descriptor structs built per call, an
error-capture frame): the same C functions called straight through cffi cost about a third of that host time
per dispatch. They take each wgpu object's `_internal` handle, which is private to wgpu-py (pinned at 0.32.0)
and to wgpudawn (pinned at 0.32.0.4). So `probe` checks at start-up that the functions and handles exist and
that a test replay through them writes what it should; when anything fails, the runtime records through
wgpu-py's methods and `tinynn info` says why (`Runtime.describe`).

Errors stay visible. Both report a validation error through the device's error callback, which wgpu-py (and
wgpudawn) turn into a Python exception around calls made through their checked wrappers (`_api.libf`). The
per-dispatch calls and the copies go straight to C (their errors are deferred: both report a bad
command at the pass's end or at finish), and the per-submission calls go through those wrappers, so an
invalid recording raises the same error as wgpu-py's methods would. Handles made here are released here,
also when finish raises.

A replay records a step's command buffers ahead of its turn (replay.py), so the calls are split: `finish`
turns an encoder into a command buffer, `submit` hands command buffers to the queue, `release` drops ones
never submitted.

The two headers differ in two places, which the subclasses cover: wgpu-native numbers its submissions
(`wgpuQueueSubmitForIndex`) and waits for one in a blocking device poll (`wgpuDevicePoll`), where Dawn's
`wgpuQueueSubmit` returns nothing and a read-back waits for the map's own future (`wgpuInstanceWaitAny`, which
Dawn runs only once the map's buffer is done with, so a replay's early read-back still waits for its own
command buffer alone: replay.py). webgpu.py names the class for its implementation.
"""
from __future__ import annotations

import numpy as np

from tinynn_gpu.runtime import webgpu
from tinynn_gpu.runtime.bindings import Bindings

PROBE_WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wg: vec3<u32>) { out[wg.x] = out[wg.x] + f32(wg.x) + 1.0; }
"""


class NativeCalls:
    """webgpu.h's C functions bound to one device (a subclass per implementation, below): the per-dispatch ones as
    plain attributes (the replay's
    loop reads them once), and the per-submission steps as methods taking native handles."""
    __slots__ = ("set_pipeline", "set_bind_group", "dispatch", "null", "_ffi", "_lib", "_checked", "_device",
                 "_queue", "_encoder_desc", "_pass_desc", "_buffer_desc", "_map_status",
                 "_on_mapped", "_map_callback", "_interrupt")

    def __init__(self, ffi, lib, checked, device):
        """checked: wgpu-py's (wgpudawn's) wrappers of the same functions, which raise the implementation's errors."""
        self.set_pipeline = lib.wgpuComputePassEncoderSetPipeline
        self.set_bind_group = lib.wgpuComputePassEncoderSetBindGroup
        self.dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
        self.null = ffi.NULL  # the bind-group call's (absent) dynamic offsets
        self._ffi, self._lib, self._checked = ffi, lib, checked
        self._device, self._queue = device._internal, device.queue._internal
        # descriptors with every field zero (no label, no timestamps), made once
        self._encoder_desc = ffi.new("WGPUCommandEncoderDescriptor *")
        self._pass_desc = ffi.new("WGPUComputePassDescriptor *")
        self._buffer_desc = ffi.new("WGPUCommandBufferDescriptor *")
        # `read`'s map callback: it stores the map's status, fired by whichever thread polls the device
        self._map_status = [0, ""]  # status (0 until the callback), the implementation's message

        # Ctrl-C raises inside the callback when it lands while the poll runs it: cffi would print the traceback
        # and drop the status, and `read` would report a map that never completed. `interrupted` keeps both: the
        # status from the callback's frame, the interrupt for `read` to raise once the buffer is unmapped.
        self._interrupt = None

        def interrupted(kind, error, traceback):
            self._interrupt = error
            if traceback is not None:
                self._map_status[0] = traceback.tb_frame.f_locals.get("status", 0)

        @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)", onerror=interrupted)
        def on_mapped(status, message, userdata1, userdata2):
            self._map_status[1] = "" if message.data == ffi.NULL else \
                ffi.string(message.data, message.length).decode(errors="replace")
            self._map_status[0] = status
        self._on_mapped = on_mapped  # kept alive with the calls
        self._map_callback = ffi.new("WGPUBufferMapCallbackInfo *", {
            "mode": lib.WGPUCallbackMode_AllowProcessEvents, "callback": on_mapped})

    def encoder(self):
        """A new command encoder's handle (released by `finish`)."""
        return self._checked.wgpuDeviceCreateCommandEncoder(self._device, self._encoder_desc)

    def copy(self, encoder, source, source_offset: int, destination, offset: int, nbytes: int) -> None:
        """A buffer-to-buffer copy between buffer handles (a bad one is reported when the encoder finishes)."""
        self._lib.wgpuCommandEncoderCopyBufferToBuffer(encoder, source, source_offset, destination, offset, nbytes)

    def resolve(self, encoder, query_set, count: int, destination) -> None:
        """The first `count` queries of a query set into a buffer, from byte 0 (handles)."""
        self._checked.wgpuCommandEncoderResolveQuerySet(encoder, query_set, 0, count, destination, 0)

    def begin_pass(self, encoder, timestamps: tuple | None = None):
        """A compute pass on the encoder (handle); timestamps: (query set handle, index written at the pass's
        start, at its end)."""
        descriptor = self._pass_desc
        if timestamps is not None:
            query_set, start, end = timestamps
            writes = self._ffi.new("WGPUPassTimestampWrites *", {
                "querySet": query_set, "beginningOfPassWriteIndex": start, "endOfPassWriteIndex": end})
            descriptor = self._ffi.new("WGPUComputePassDescriptor *", {"timestampWrites": writes})
        return self._checked.wgpuCommandEncoderBeginComputePass(encoder, descriptor)

    def end_pass(self, compute_pass) -> None:
        """End the pass and release its handle (also when ending raises)."""
        try:
            self._checked.wgpuComputePassEncoderEnd(compute_pass)
        finally:
            self._lib.wgpuComputePassEncoderRelease(compute_pass)

    def begin(self, copies=()) -> tuple:
        """A new command encoder with `copies` recorded on it ((source, offset, destination, offset, bytes):
        buffer handles, byte counts), then a compute pass open: (encoder, pass) handles."""
        encoder = self.encoder()
        for copy in copies:
            self.copy(encoder, *copy)
        return encoder, self.begin_pass(encoder)

    def finish(self, encoder, compute_pass=None, copies=()):
        """End the pass (if any), record `copies` (as `begin` takes them) after it, finish: the command buffer's
        handle. The encoder's and the pass's handles are released, also when this raises."""
        try:
            if compute_pass is not None:
                self.end_pass(compute_pass)
            for copy in copies:
                self.copy(encoder, *copy)
            return self._checked.wgpuCommandEncoderFinish(encoder, self._buffer_desc)
        finally:
            self._lib.wgpuCommandEncoderRelease(encoder)

    def submit(self, command_buffers) -> int | None:
        """Submit command buffers (handles), in order, and release them (also when submitting raises). Returns
        the submission's index where the implementation numbers them (`read` can wait for it), else None, and
        None when there was nothing to submit."""
        if not command_buffers:
            return None
        handles = self._ffi.new("WGPUCommandBuffer[]", command_buffers)
        try:
            return self._submit(len(command_buffers), handles)
        finally:
            self.release(command_buffers)

    def release(self, command_buffers) -> None:
        """Release command buffers that will not be submitted."""
        for command_buffer in command_buffers:
            self._lib.wgpuCommandBufferRelease(command_buffer)

    def write(self, buffer, data, offset: int = 0) -> None:
        """queue.write_buffer of `data` (bytes or a contiguous array) at a byte offset of a buffer handle."""
        view = self._ffi.from_buffer(data)
        self._checked.wgpuQueueWriteBuffer(self._queue, buffer, offset, view, len(view))

    def read(self, buffer, parts, until=None) -> None:
        """Copy bytes of a MAP_READ buffer handle into host arrays once everything submitted before has run (see
        `until`):
        `parts` is [(byte offset, writable contiguous array), ...], each array filled from its offset. Map, copy,
        unmap, waiting in one blocking poll of the device from this thread: wgpu-py's `map_sync` waits through its
        poll thread and an event instead, two thread hand-overs that cost a synced step time.

        `until`: the index of the last submission that writes the buffer, where later ones may still run (a
        replay's result, copied out by the command buffer that made it): the map waits for that one alone."""
        ffi, lib, status = self._ffi, self._lib, self._map_status
        views = [(offset, ffi.from_buffer(into, require_writable=True)) for offset, into in parts]
        size = max(offset + len(view) for offset, view in views)
        status[0], self._interrupt = 0, None
        future = self._checked.wgpuBufferMapAsync(buffer, lib.WGPUMapMode_Read, 0, size, self._map_callback[0])
        self._wait_mapped(future, until)
        if not status[0]:
            raise RuntimeError("a read-back buffer's map never completed (was the device lost?)")
        if status[0] != lib.WGPUMapAsyncStatus_Success:
            raise RuntimeError(f"could not map a read-back buffer: {status[1] or f'status {status[0]}'}")
        try:
            mapped = self._checked.wgpuBufferGetConstMappedRange(buffer, 0, size)
            if mapped == self.null:
                raise RuntimeError(f"a mapped read-back buffer gave no range of {size} bytes")
            for offset, view in views:
                ffi.memmove(view, ffi.cast("char *", mapped) + offset, len(view))
        finally:
            lib.wgpuBufferUnmap(buffer)
        if self._interrupt is not None:
            raise self._interrupt

    def record(self, compute_pass, runs) -> None:
        """The replay's inner loop: runs of (pipeline, [(bind group, x, y, z), ...]) handles."""
        set_pipeline, set_bind_group, dispatch, null = self.set_pipeline, self.set_bind_group, self.dispatch, self.null
        for pipe, dispatches in runs:
            set_pipeline(compute_pass, pipe)
            for group, x, y, z in dispatches:
                set_bind_group(compute_pass, 0, group, 0, null)
                dispatch(compute_pass, x, y, z)


class WgpuNativeCalls(NativeCalls):
    """wgpu-native's: numbered submissions, and a blocking device poll that can wait for one."""
    __slots__ = ()

    def _submit(self, count: int, handles) -> int:
        return self._checked.wgpuQueueSubmitForIndex(self._queue, count, handles)

    def _wait_mapped(self, future, until) -> None:
        """Until the map's callback has run (or the queue is idle without it: `read` raises)."""
        status, lib = self._map_status, self._lib
        idle, wait_for = False, self.null if until is None else self._ffi.new("WGPUSubmissionIndex *", until)
        while not status[0] and not idle:  # the callback fires inside a poll: this one's, or wgpu-py's poll thread's
            idle = lib.wgpuDevicePoll(self._device, 1, wait_for)  # True: the queue was empty (callbacks run)
            wait_for = self.null  # a map still waiting after that: wait for everything


class DawnCalls(NativeCalls):
    """Dawn's: unnumbered submissions; a read-back waits for its map's future (the map completes once the work
    that uses the buffer is done, so `until` is not needed)."""
    __slots__ = ("_instance", "_wait_info")
    WAIT_NS = 100_000_000  # waited in slices, so that a KeyboardInterrupt comes through

    def __init__(self, ffi, lib, checked, device):
        super().__init__(ffi, lib, checked, device)
        from wgpudawn.backends.dawn._helpers import get_wgpu_instance
        self._instance = get_wgpu_instance()
        self._wait_info = ffi.new("WGPUFutureWaitInfo *")

    def _submit(self, count: int, handles) -> None:
        self._checked.wgpuQueueSubmit(self._queue, count, handles)

    def _wait_mapped(self, future, until) -> None:
        info, lib = self._wait_info, self._lib
        info.future.id, info.completed = future.id, 0
        while not info.completed:
            status = self._checked.wgpuInstanceWaitAny(self._instance, 1, info, self.WAIT_NS)
            if status not in (lib.WGPUWaitStatus_Success, lib.WGPUWaitStatus_TimedOut):
                raise RuntimeError(f"waiting for a read-back buffer's map failed (wait status {status})")


def probe(device) -> tuple[NativeCalls | None, str]:
    """(the direct calls, "") when they work on this device, else (None, why not)."""
    implementation = webgpu.chosen()
    try:
        calls = implementation.Calls(*implementation.cffi(), device)
    except (ImportError, AttributeError) as e:
        return None, f"{implementation.name}'s cffi functions are not reachable ({type(e).__name__}: {e})"
    wgpu = implementation.api
    try:
        n = 4
        buffer = device.create_buffer(size=4 * n, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
                                      | wgpu.BufferUsage.COPY_DST)
        copy = device.create_buffer(size=4 * n, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        module = device.create_shader_module(label="native probe", code=PROBE_WGSL)
        pipe = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        (slot,) = Bindings.parse(PROBE_WGSL, "native probe").slots("main", ("out",))
        group = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": slot, "resource": {"buffer": buffer, "offset": 0, "size": 4 * n}}])
        calls.write(buffer._internal, np.full(n, 10, np.float32))
        encoder, compute_pass = calls.begin()
        calls.record(compute_pass, [(pipe._internal, [(group._internal, n, 1, 1)])])
        calls.submit([calls.finish(encoder, compute_pass, [(buffer._internal, 0, copy._internal, 0, 4 * n)])])
        got = np.zeros(n, np.float32)
        calls.read(copy._internal, [(0, got)])
    except Exception as e:  # any failure means: record through wgpu-py's methods instead
        return None, (f"a test dispatch through {implementation.name}'s C functions failed "
                      f"({type(e).__name__}: {e})")
    if not np.array_equal(got, np.arange(11, 11 + n, dtype=np.float32)):
        return None, (f"a test dispatch through {implementation.name}'s C functions wrote {got.tolist()}, "
                      "not [11, 12, 13, 14]")
    return calls, ""
