"""The runtime under every GPU op, composed of one part per job:

- `pool` (pool.py): the buffers under the arrays;
- `kernels` (kernels.py): shader modules, pipelines, uniforms, prepared dispatches and bind groups, cached;
- `recording` (recorder.py): the open encoder and pass, through wgpu-py's methods or webgpu.h's C functions,
  chosen once (`use_native`);
- `transfer` (transfer.py): writes and read-backs; `profiler` (profiling.py); `replayer` (replay.py), which runs
  captured steps (capture.py) again, on the recording's path (chosen with it).

Ops only record dispatches (`launch`, `dispatch`): they go into one compute pass, submitted only when something
must reach the queue (a write, a read-back, destroying buffers: `flush`). The host waits only in `read`.
"""
from __future__ import annotations

import os
import weakref
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tinynn_gpu.runtime import native, settings
from tinynn_gpu.runtime.arrays import FLOAT32, GpuArray
from tinynn_gpu.runtime.kernels import KernelCache, Launch
from tinynn_gpu.runtime.pool import STORAGE_USAGE, BufferPool, _bucket, _round4
from tinynn_gpu.runtime.profiling import Profiler
from tinynn_gpu.runtime.recorder import MethodRecorder, NativeRecorder
from tinynn_gpu.runtime.replay import MethodReplayer, NativeReplayer
from tinynn_gpu.runtime.transfer import Transfer

# cores from which a replay records a later one on a worker thread (replay.py); on 2 cores the worker would
# only compete with the caller's thread
RECORD_THREAD_CPUS = 4


class Runtime:
    def __init__(self, ctx):
        self.ctx = ctx
        self.device = ctx.device
        self.queue = ctx.device.queue
        self.subgroups = ctx.subgroups and settings.current().subgroups  # read once (group_sum.py)
        self.counters = Counter()
        self.pool = BufferPool(self.device, ctx.limits["max-storage-buffer-binding-size"], self.empty_cache)
        self.kernels = KernelCache(ctx, self.counters)
        self.shader, self.prepare, self.keep = self.kernels.shader, self.kernels.prepare, self.kernels.keep
        self.launches, self.bind_groups = self.kernels.launches, self.kernels.bind_groups
        self.transfer = Transfer(self)
        self.write, self.read = self.transfer.write, self.transfer.read
        self.profiler = Profiler(self)
        self.tape = None  # while capturing a step (capture.py): the Tape recording it
        self.stand_ins = []  # `stand_in`'s arrays
        self.scratches = {}  # `scratch`'s arrays: i -> (array, its size)
        self._sync_source = None
        # transfer.KERNEL_ERRORS' bits, which kernels set on bad input (an array: `launch` binds arrays)
        self.error_flags = GpuArray(self.device.create_buffer(size=4, usage=STORAGE_USAGE), (1,), np.dtype(np.uint32))
        self.recording, self.native, self.native_reason = None, None, ""
        self.record_thread, self._stop_record_thread = None, None
        self.orphaned_aheads = deque()  # dropped recordings ahead, released by the next replay or flush
        # the last replay's result, copied for the host by the command buffer that made it: (a weak reference to
        # its array, replay.Ahead's `read`, that submission's index), or None once anything else is recorded or
        # written (`read` reads it there when it is the next array read)
        self.early_read = None
        self.use_native(*native.probe(self.device))

    def use_native(self, calls, reason: str = "", threaded: bool | None = None) -> None:
        """Record through webgpu.h's C functions (`calls`), or through wgpu-py's methods when calls is None
        (then `reason` says why). With `threaded` (default: with RECORD_THREAD_CPUS cores or more, on a device that
        lets a second thread record: webgpu.py), a replay records a later one on a worker thread (replay.py). Tests
        switch paths with it."""
        if self.recording is not None:
            self.flush()
        self.native, self.native_reason, self.early_read = calls, reason, None
        if calls is None:
            self.recording, self.replayer = MethodRecorder(self.device, self._opened), MethodReplayer(self)
        else:
            self.recording, self.replayer = NativeRecorder(calls, self._opened), NativeReplayer(self)
        self.replay = self.replayer.replay
        if threaded is None:
            threaded = (os.cpu_count() or 1) >= RECORD_THREAD_CPUS and self.ctx.threads_may_record
        if self.record_thread is not None and not (calls and threaded):
            self._stop_record_thread.detach()
            self.record_thread.shutdown()  # after the recording it has: a tape still collects its result
            self.record_thread = None
        if calls and threaded and self.record_thread is None:
            self.counters["record_thread_us"] += 0  # the key exists before the thread adds to it
            self.record_thread = ThreadPoolExecutor(1, thread_name_prefix="tinynn-record")
            # the thread does not outlive its runtime
            self._stop_record_thread = weakref.finalize(self, self.record_thread.shutdown, False)

    def _opened(self) -> None:
        """A new encoder: a command after the last replay might write its result, and the staged writes go first."""
        self.early_read = None
        self.transfer.record_staged()

    def describe(self) -> dict:
        webgpu = self.ctx.implementation.name
        how = f"direct {webgpu} calls" if self.native else f"wgpu-py methods ({self.native_reason})"
        if self.record_thread:
            how += ", replays recorded ahead on a worker thread"
        return {"recording": how}

    def not_capturable(self, reason: str) -> None:
        """Tell a step being captured that it cannot be replayed, and why (it then runs eagerly)."""
        if self.tape is not None:
            self.tape.broken = reason

    # --- arrays ---
    @property
    def max_binding(self) -> int:
        """The most bytes one storage binding holds: a larger array lives on the host (the pool refuses it)."""
        return self.pool.max_binding

    @max_binding.setter
    def max_binding(self, nbytes: int) -> None:
        self.pool.max_binding = nbytes

    def empty(self, shape, dtype=FLOAT32) -> GpuArray:
        """An uninitialised array from the pool (~1 per eager dispatch)."""
        return self.pool.empty(shape, dtype)

    def memory_stats(self, reset_peak: bool = False) -> dict:
        return self.pool.memory_stats(reset_peak)

    @property
    def pooled_bytes(self) -> int:
        return self.pool.pooled_bytes

    def empty_cache(self) -> None:
        """Destroy the pooled buffers and the read-back staging buffers, giving their memory to the driver."""
        self.flush()  # a pooled buffer may be named by commands not yet submitted
        dead = self.pool.destroy_pooled()
        self.transfer.destroy_staging()
        self.kernels.forget_buffers(dead)  # bind groups that name destroyed buffers

    def upload(self, x: np.ndarray) -> GpuArray:
        arr = self.empty(x.shape, x.dtype)
        self.write(arr, x)
        return arr

    def copy(self, arr: GpuArray) -> GpuArray:
        """A new array holding arr's values, copied on the GPU in order with the work recorded so far."""
        self.not_capturable("the step copies an array")
        out = self.empty(arr.shape, arr.dtype)
        self.copy_into(arr, out)
        return out

    def copy_into(self, arr: GpuArray, out: GpuArray) -> None:
        self.recording.copy(arr.buffer, 0, out.buffer, 0, _round4(max(4, arr.nbytes)))

    def stand_in(self, i: int) -> GpuArray:
        """The i-th one-element array bound where a kernel's optional array is absent (the kernel never
        touches it then). A dispatch's slots take different i: one buffer may not fill two writable
        bindings of a dispatch, nor a readable and a writable one."""
        try:
            return self.stand_ins[i]
        except IndexError:
            while len(self.stand_ins) <= i:
                self.stand_ins.append(self.empty((1,)))
            return self.stand_ins[i]

    def scratch(self, i: int, n: int) -> GpuArray:
        """The i-th array of at least n float32s that kernels write and nothing reads: bound in place of the
        outputs a forward makes only for its backward, where none will run (`for_backward`), so an eager
        forward under no_grad allocates none of them. Grown to a whole size bucket when too small; as with
        `stand_in`, a dispatch's slots take different i."""
        found = self.scratches.get(i)
        if found is None or found[1] < n:
            # a whole bucket where one binding holds it; past that, n itself (which `empty` refuses if too large)
            array = self.empty((max(n, min(_bucket(4 * max(1, n)), self.max_binding) // 4),))
            found = self.scratches[i] = (array, array.size)
        return found[0]

    def read_back_buffer(self, size: int):
        return self.transfer.read_back_buffer(size)

    def sync(self) -> None:
        if self._sync_source is None:
            self._sync_source = self.empty((1,), np.float32)
        self.read(self._sync_source)

    # --- recording ---
    def launch(self, launch: Launch | None, arrays) -> None:
        """Record a prepared dispatch over `arrays` (GpuArrays) at its slots, in their order. Every eager op runs
        through here: plain look-ups (the bind group's), then the recorder."""
        if launch is None:
            return
        pipe = launch.pipeline
        key = [launch]
        for a in arrays:  # a loop, not a comprehension: in Python 3.11 that is a function call of its own
            key.append(a.buffer)
        key = tuple(key)
        group = self.bind_groups.get(key) or self.kernels.bind_group(key)
        if self.tape is not None:
            self.tape.events.append(("dispatch", pipe, group, launch.groups))
            for value in arrays:
                self.tape.hold(value)
        profiler = self.profiler
        if profiler.state is None:
            self.recording.dispatch(pipe, group, launch.groups)
        else:
            profiler.begin(f"{launch.shader.label}.{launch.entry}")
            self.recording.dispatch(pipe, group, launch.groups)
            profiler.end()
        self.counters["dispatches"] += 1

    def dispatch(self, module, entry: str, groups, bindings: dict, params=None) -> None:
        """Record one dispatch (`prepare`'s arguments, `bindings` mapping the WGSL's binding names to arrays), made
        ready afresh: for ops whose shapes seldom repeat."""
        self.launch(self.prepare(module, entry, groups, tuple(bindings), params), bindings.values())

    @property
    def profiling(self) -> bool:
        return self.profiler.state is not None

    def profile(self, fn) -> list[dict]:
        return self.profiler.profile(fn)

    def time_pass(self, fn, reps: int) -> float:
        return self.profiler.time_pass(fn, reps)

    def flush(self) -> None:
        """Submit everything recorded so far (no waiting for the GPU). Everything that reaches the queue
        (writes, read-backs, destroying buffers) flushes first."""
        self.replayer.release_orphans()
        if self.recording.encoder is None and not self.transfer.staged_copies:
            return
        self.recording.open()  # records the staged copies, when they are all there is
        self.recording.end_pass()
        self.transfer.upload_staged()
        self.recording.submit()
        self.counters["submissions"] += 1
