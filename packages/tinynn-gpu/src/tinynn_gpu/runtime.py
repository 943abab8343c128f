"""The runtime under every GPU op: the caches, the recorder that batches dispatches into one compute pass
and submits only when it must, the read-backs, and the replay of captured steps.

- The arrays and their buffer pool: pool.py (`GpuArray`, `BufferPool`, which `Runtime` extends).
- Caches: shader modules by the hash of their WGSL, pipelines by (module, entry point); uniform buffers
  by their bytes; prepared dispatches (`Launch`: pipeline, slots, uniforms, workgroups) by what they hold,
  so one Launch stands for them all; bind groups by (Launch, buffers), because creating a bind group costs
  ~50 us and a training step repeats them all; an op's Launches by its shapes and parameters (`keep`), so
  that an eager op's repeat packs nothing.
- Recording goes through wgpu-native's C functions directly where `native.probe` found them working
  (a third of wgpu-py's host cost per dispatch), else through wgpu-py's methods: `encoder` and
  `compute_pass` then hold native handles, not wgpu-py objects, and every command goes through the
  methods below (`_copy`, `_begin_pass`, `_end_pass`, `flush`), which take either.
- The replay of captured steps: replay.py (`Replaying`, a mixin of `Runtime`). It records each step's next
  replay ahead, on a worker thread (`recorder`) where there are cores for one; that thread never touches the
  queue, so nothing here waits for it.
- Small writes are staged: one queue write per submission, the copies in order with the dispatches.
- The host waits only in `read` (and `sync`, which reads 4 bytes): `queue.on_submitted_work_done_sync()`
  is broken in wgpu 0.32, and mapping a buffer written by the last submission waits for all before it. With
  the direct calls the map waits in this thread (native.NativeCalls.read), not through wgpu-py's poll thread,
  and the read-back of a replayed step's result waits only for the command buffer that made it (replay.py).
"""
from __future__ import annotations

import hashlib
import os
import weakref
from collections import Counter, defaultdict, deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import wgpu

from tinynn.errors import TinynnError
from tinynn.numpy_backend import EMBEDDING_RANGE, TARGET_RANGE
from tinynn_gpu import native
from tinynn_gpu.group_sum import uses_subgroups
from tinynn_gpu.params import ParamsLayout
from tinynn_gpu.pool import (STORAGE_USAGE, BufferPool, GpuArray, OnCpu, TooLarge, _bucket,  # noqa: F401 (re-exported)
                             _round4)
from tinynn_gpu.replay import Replaying

MAX_GROUPS = 65535  # per dispatch dimension
WG = 256  # threads per workgroup of the 1-D kernels
CACHE_SIZE = 8192
QUERY_CAPACITY = 4096  # WebGPU's most timestamps in one query set
# Bits a kernel sets in the error-flags word (atomicOr; embedding.wgsl, cross_entropy.wgsl), and the error
# each becomes: `read` copies the word back with every read-back and raises, so a bad input surfaces at the
# step's one read-back with the NumPy backend's message, and never as a silently wrong number.
KERNEL_ERRORS = {1: EMBEDDING_RANGE, 2: TARGET_RANGE}
# Writes up to this many bytes are staged (`Runtime.write`): a training step's token ids, targets and optimizer
# values then cost one queue write, not three (each ~26 us of host time on the H200: wgpu-native makes a
# staging buffer per write)
STAGED_WRITE_BYTES = 1 << 20
# cores from which a replay records a later one on a worker thread (replay.py); on 2 cores the worker would
# only compete with the caller's thread
RECORD_THREAD_CPUS = 4


class Shader:
    """A compiled shader module, the layout of its `struct Params`, and the hash of its WGSL, which keys
    it: variants that differ only in a constant are different shaders however they are labelled."""
    __slots__ = ("module", "params", "key", "label", "pipelines")

    def __init__(self, module, params: ParamsLayout | None, key: str, label: str):
        self.module = module
        self.params = params
        self.key = key
        self.label = label
        self.pipelines = {}  # entry point -> compute pipeline


class Launch:
    """A dispatch made ready by `Runtime.prepare`: the pipeline, the binding slots, the buffers bound after the
    arrays (the uniform of its parameters, or none) and the workgroup counts; `Runtime.launch` adds the arrays.
    One object per distinct content (`Runtime.prepared`), so it keys its bind groups by identity: a key of
    (Launch, buffers) costs less to build and hash than one naming the pipeline, slots and uniforms."""
    __slots__ = ("shader", "entry", "pipeline", "slots", "uniforms", "groups")

    def __init__(self, shader: Shader, entry: str, pipeline, slots: tuple, uniforms: tuple, groups: tuple):
        self.shader, self.entry, self.pipeline = shader, entry, pipeline
        self.slots, self.uniforms, self.groups = slots, uniforms, groups


class Runtime(Replaying, BufferPool):
    def __init__(self, ctx):
        super().__init__(ctx.device, ctx.limits["max-storage-buffer-binding-size"])
        self.ctx = ctx
        self.queue = ctx.device.queue
        self.shaders = {}  # hash of the WGSL -> Shader
        self.kernels = {}  # kernel file name (group_sum's: (name, subgroups, team width)) -> Shader
        self.subgroups = uses_subgroups(ctx)  # TINYNN_SUBGROUPS, read once (group_sum.py)
        self.entry_points = {}  # (kernel file name or Shader, entry point) -> (Shader, pipeline): one look-up
        self.uniforms = {}  # bytes -> uniform buffer
        self.prepared = {}  # (pipeline, slots, uniforms, workgroups) -> its one Launch (`prepare`)
        self.bind_groups = {}  # (Launch, buffer, ...) -> bind group
        self.launches = {}  # an op's key (its shader, shapes and parameters) -> its Launch (`keep`)
        self.staging = {}  # bucket size -> MAP_READ buffer for read-backs
        self.encoder = None  # the open command encoder: a wgpu-py object, or a native handle (`native`)
        self.compute_pass = None  # the open compute pass in it, the same kind
        self.upload_buffer = None  # the staged writes' source buffer, written once per submission (`flush`)
        self.staged = []  # the bytes of the staged writes not yet in it, 4-byte aligned, in order
        self.staged_copies = []  # (buffer, offset, upload offset, bytes) of staged writes not yet recorded
        self._pass_pipeline = None  # the pipeline set in the open pass
        self.counters = Counter()
        self._sync_source = None
        self._profile = None  # while profiling: {"queries", "labels", "times"}
        self.tape = None  # while capturing a step (capture.py): the Tape recording it
        self.stand_ins = []  # `stand_in`'s arrays
        self.scratches = {}  # `scratch`'s arrays: i -> (array, its size)
        # KERNEL_ERRORS' bits, which kernels set on bad input (an array: `launch` binds arrays)
        self.error_flags = GpuArray(self.device.create_buffer(size=4, usage=STORAGE_USAGE), (1,), np.dtype(np.uint32))
        self.native, self.native_reason, self.recorder, self._stop_recorder = None, "", None, None
        self.orphaned_aheads = deque()  # dropped recordings ahead, released by the next replay or flush
        # the last replay's result, copied for the host by the command buffer that made it: (a weak reference to
        # its array, replay.Ahead's `read`, that submission's index), or None once
        # anything else is recorded or written (`read` reads it there when it is the next array read)
        self.early_read = None
        self.use_native(*native.probe(self.device))

    def use_native(self, calls, reason: str = "", threaded: bool | None = None) -> None:
        """Record through wgpu-native's C functions (`calls`), or through wgpu-py's methods when calls is None
        (then `reason` says why). With `threaded` (default: with RECORD_THREAD_CPUS cores or more), a replay
        records a later one on a worker thread (replay.py). Tests switch paths with it."""
        self.flush()
        self.native, self.native_reason, self.early_read = calls, reason, None
        if threaded is None:
            threaded = (os.cpu_count() or 1) >= RECORD_THREAD_CPUS
        if self.recorder is not None and not (calls and threaded):
            self._stop_recorder.detach()
            self.recorder.shutdown()  # after the recording it has: a tape still collects its result
            self.recorder = None
        if calls and threaded and self.recorder is None:
            self.counters["record_thread_us"] += 0  # the key exists before the thread adds to it
            self.recorder = ThreadPoolExecutor(1, thread_name_prefix="tinynn-record")
            # the thread does not outlive its runtime
            self._stop_recorder = weakref.finalize(self, self.recorder.shutdown, False)

    def describe(self) -> dict:
        how = "direct wgpu-native calls" if self.native else f"wgpu-py methods ({self.native_reason})"
        if self.recorder:
            how += ", replays recorded ahead on a worker thread"
        return {"recording": how}

    def empty_cache(self) -> None:
        """Destroy the pooled buffers and the read-back staging buffers, giving their memory to the driver."""
        self.flush()  # a pooled buffer may be named by commands not yet submitted
        dead = self._destroy_pooled()
        for buffer in self.staging.values():
            buffer.destroy()
        self.staging.clear()
        for key in [k for k in self.bind_groups if any(buf in dead for buf in k[1:])]:
            del self.bind_groups[key]  # they name destroyed buffers

    def copy(self, arr: GpuArray) -> GpuArray:
        """A new array holding arr's values, copied on the GPU in order with the work recorded so far."""
        if self.tape is not None:
            self.tape.broken = "the step copies an array"
        out = self.empty(arr.shape, arr.dtype)
        self._copy_into(arr, out)
        return out

    def _copy_into(self, arr: GpuArray, out: GpuArray) -> None:
        self._copy(arr.buffer, 0, out.buffer, 0, _round4(max(4, arr.nbytes)))

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

    def upload(self, x: np.ndarray) -> GpuArray:
        arr = self.empty(x.shape, x.dtype)
        self.write(arr, x)
        return arr

    def write(self, arr: GpuArray, x: np.ndarray, start: int | None = None) -> None:
        """Overwrite arr's buffer with x (same byte size); with `start`, x's elements from arr's flat element
        start on (the rest of arr kept). In order with the dispatches recorded around it."""
        data = np.ascontiguousarray(x, dtype=arr.dtype)  # written from its memory: no bytes copy (43 MB: 48 ms)
        if (data.nbytes != arr.nbytes) if start is None else not 0 <= start <= arr.size - data.size:
            raise ValueError(f"cannot write {x.shape} {x.dtype} into a {arr.shape} {arr.dtype} array"
                             + ("" if start is None else f" at element {start}"))
        offset = (start or 0) * arr.dtype.itemsize
        self.counters["uploads"] += 1
        self.early_read = None  # the write might land in the last replay's result
        if not data.nbytes:
            return
        if self.tape is None and data.nbytes <= STAGED_WRITE_BYTES and data.nbytes % 4 == offset % 4 == 0:
            self._stage(arr.buffer, offset, data)
            return
        self.flush()  # queue.write_buffer runs before commands not yet submitted: submit those first
        self._queue_write(arr.buffer, data, offset)
        if self.tape is not None:  # inside a captured step this is a constant: replay writes the same bytes
            self.tape.events.append(("write", arr.buffer, data.tobytes(), offset))
            self.tape.hold(arr)

    def _stage(self, buffer, offset: int, data: np.ndarray) -> None:
        """A small write as a copy command from the upload buffer, in order with the dispatches around it:
        recorded now if commands are waiting in the encoder, else by the next encoder before anything else
        (`_encoder`; a replay records them into its first command buffer). Its bytes go into the upload
        buffer with every other staged write of the submission, in one queue write, when that is submitted."""
        at = sum(len(b) for b in self.staged)
        if self.upload_buffer is None or at + data.nbytes > self.upload_buffer.size:
            if at:
                self.flush()
                at = 0
            if self.upload_buffer is None or data.nbytes > self.upload_buffer.size:
                self.upload_buffer = self.device.create_buffer(
                    size=_bucket(max(data.nbytes, 4096)), usage=wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST)
        self.staged.append(data.tobytes())  # a copy: the caller may change x once this returns
        if self.encoder is None:
            self.staged_copies.append((buffer, offset, at, data.nbytes))
        else:
            self._copy(self.upload_buffer, at, buffer, offset, data.nbytes)

    def _upload_staged(self) -> None:
        """The staged writes' bytes into the upload buffer in one queue write, just before the submission
        whose copies read them (not sooner: those copies' offsets count from the first staged write)."""
        if self.staged:
            self._queue_write(self.upload_buffer, b"".join(self.staged), 0)
            self.staged.clear()

    def _queue_write(self, buffer, data, offset: int) -> None:
        if self.native is not None:
            self.native.write(buffer._internal, data, offset)
        else:
            self.queue.write_buffer(buffer, offset, data)
        self.counters["queue_writes"] += 1

    def read(self, arr: GpuArray, out: np.ndarray | None = None, start: int | None = None) -> np.ndarray:
        """Copy an array back to the host (into `out` when given): the one place the host waits for the GPU.
        With `start`, only out.size elements from arr's flat element start on come back, into out."""
        if self.tape is not None:
            self.tape.broken = "the step reads a value back"
        if start is None:
            if out is not None and (out.shape != arr.shape or out.dtype != arr.dtype):
                raise ValueError(f"cannot read a {arr.shape} {arr.dtype} array into a {out.shape} {out.dtype} one")
            out = np.empty(arr.shape, arr.dtype) if out is None else out
            start = 0
        elif not 0 <= start <= arr.size - out.size:
            raise ValueError(f"cannot read {out.size} elements at element {start} of a {arr.shape} array")
        nbytes = out.size * arr.dtype.itemsize
        if nbytes == 0:
            return out
        early, self.early_read = self.early_read, None
        result = None if early is None else early[0]()  # None too once the result was dropped
        if result is not None and result is (arr.base or arr) and start == 0 and out.size == arr.size:
            # the result of the replay just submitted (nothing recorded since), which the step's command buffer
            # that made it copied for the host with the error flags: wait for that one, not the whole step
            (staging, flags_at, _), until = early[1], early[2]
        else:
            flags_at = _round4(nbytes)  # the kernels' error flags come back behind the data
            size = _bucket(flags_at + 4)
            staging = self.staging.get(size)
            if staging is None:
                staging = self.staging[size] = self.read_back_buffer(size)
            self._copy(arr.buffer, start * arr.dtype.itemsize, staging, 0, flags_at)
            self._copy(self.error_flags.buffer, 0, staging, flags_at, 4)
            self.flush()
            until = None
        if self.native is not None:  # the values straight into `out` where it is one block of memory
            flags_word = np.zeros(1, np.uint32)
            into = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
            self.native.read(staging._internal, [(0, into), (flags_at, flags_word)], until)
            flags = int(flags_word[0])
            if into is not out:
                out[...] = into
        else:
            staging.map_sync(wgpu.MapMode.READ, 0, flags_at + 4)
            mapped = staging.read_mapped(0, flags_at + 4, copy=False)  # copied once, below, before unmap
            flags = int.from_bytes(mapped[flags_at:], "little")
            out[...] = np.frombuffer(mapped, dtype=arr.dtype, count=out.size).reshape(out.shape)
            del mapped
            staging.unmap()
        self.counters["host_syncs"] += 1
        if flags:
            self.queue.write_buffer(self.error_flags.buffer, 0, bytes(4))  # raised once
            raise TinynnError("; ".join(msg for bit, msg in KERNEL_ERRORS.items() if flags & bit))
        return out

    def read_back_buffer(self, size: int):
        """A buffer the GPU copies into and the host maps to read (`read`, and a replay's result: replay.py)."""
        return self.device.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def sync(self) -> None:
        if self._sync_source is None:
            self._sync_source = self.empty((1,), np.float32)
        self.read(self._sync_source)

    # --- caches ---
    def shader(self, code: str, label: str, module=None) -> Shader:
        """The compiled module of this WGSL (compiled on first sight; `module`: already compiled)."""
        key = hashlib.sha256(code.encode()).hexdigest()
        shader = self.shaders.get(key)
        if shader is None:
            module = module or self.ctx.compile(label, code)
            shader = self.shaders[key] = Shader(module, ParamsLayout.parse(code, label), key, label)
        return shader

    def kernel(self, name: str) -> Shader:
        """A kernel file's module (context.py compiled them all at start-up)."""
        shader = self.kernels.get(name)
        if shader is None:
            shader = self.kernels[name] = self.shader(self.ctx.sources[name], name, self.ctx.modules[name])
        return shader

    def pipeline(self, shader: Shader, entry: str):
        """The compute pipeline of one entry point, cached by the code it runs (a label can repeat)."""
        pipe = shader.pipelines.get(entry)
        if pipe is None:
            pipe = shader.pipelines[entry] = self.device.create_compute_pipeline(
                layout="auto", compute={"module": shader.module, "entry_point": entry},
                label=f"{shader.label}.{entry}")
        return pipe

    def uniform(self, data: bytes) -> object:
        """A uniform buffer holding these bytes, cached by them: a training step repeats its parameters."""
        buf = self.uniforms.get(data)
        if buf is None:
            buf = self.uniforms[data] = self.device.create_buffer_with_data(data=data, usage=wgpu.BufferUsage.UNIFORM)
            _trim(self.uniforms)
        return buf

    def bind_group(self, key: tuple):
        """The bind group of a key (Launch, buffer, ...): the buffers, then the Launch's uniforms, at its slots in
        order; made once and cached. Keyed by the objects, in the caller's order: no sorting, no pair per slot,
        and a key keeps its buffers alive (a call site passes its slots in one order; another order costs one
        more bind group, once)."""
        group = self.bind_groups.get(key)
        if group is None:
            launch = key[0]
            entries = [{"binding": slot, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
                       for slot, buf in zip(launch.slots, key[1:] + launch.uniforms)]
            group = self.bind_groups[key] = self.device.create_bind_group(
                layout=launch.pipeline.get_bind_group_layout(0), entries=entries)
            self.counters["bind_groups_created"] += 1
            _trim(self.bind_groups)
        return group

    # --- recording ---
    def prepare(self, module, entry: str, groups, slots: tuple, params=None, more_params=()) -> Launch | None:
        """One dispatch of `entry` in `module` (a kernel file's name, or a Shader from `shader`) made ready, but
        for its arrays: `slots` are the binding slots they will fill, in order; `params` (a dict of the module's
        `struct Params` fields) becomes the uniform at slot 3, and each (slot, dict) of `more_params` another
        uniform of the same struct (a paired matmul's second problem); `groups` is a workgroup count or an
        (x, y, z) tuple. None: no workgroups, nothing to run. An op that records the same shape again keeps its
        Launch (`launch`) and so skips the look-ups and the packing."""
        if groups.__class__ is int:
            groups = (groups, 1, 1) if 0 < groups <= MAX_GROUPS else grid(groups)
        if 0 in groups:
            return None
        found = self.entry_points.get((module, entry))
        if found is None:
            shader = module if isinstance(module, Shader) else self.kernel(module)
            found = self.entry_points[(module, entry)] = (shader, self.pipeline(shader, entry))
        shader, pipe = found
        if shader.params is not None:
            more = [(3, params or {}), *more_params]
            slots = (*slots, *(slot for slot, _ in more))
            uniforms = tuple(self.uniform(shader.params.pack(values)) for _, values in more)
        elif params:
            raise ValueError(f"{shader.label} declares no struct Params, but was given {params}")
        else:
            slots, uniforms = tuple(slots), ()
        key = (pipe, slots, uniforms, groups)
        launch = self.prepared.get(key)
        if launch is None:
            launch = self.prepared[key] = Launch(shader, entry, pipe, slots, uniforms, groups)
            _trim(self.prepared)
        return launch

    def launch(self, launch: Launch | None, arrays) -> None:
        """Record a prepared dispatch over `arrays` (GpuArrays) at its slots, in their order. Every eager op runs
        through here: plain look-ups (the bind group's), and the commands recorded inline through the direct calls
        (else `_encode_methods`)."""
        if launch is None:
            return
        pipe = launch.pipeline
        key = [launch]
        for a in arrays:  # a loop, not a comprehension: in Python 3.11 that is a function call of its own
            key.append(a.buffer)
        key = tuple(key)
        # the cache's hit looked up here, not in a call of bind_group: that call cost 0.1-0.2 us of an eager
        # dispatch's ~6.1 (2-core machine, eager_host_cost.py --recorded, session 14)
        group = self.bind_groups.get(key) or self.bind_group(key)
        if self.tape is not None:
            self.tape.events.append(("dispatch", pipe, group, launch.groups))
            for value in arrays:
                self.tape.hold(value)
        if self._profile is not None:
            self._begin_timed_pass(f"{launch.shader.label}.{launch.entry}")
        calls = self.native
        if calls is None:
            self._encode_methods(pipe, group, launch.groups)
        else:
            handle = self.compute_pass or self._begin_pass()
            if pipe is not self._pass_pipeline:  # runs of one kernel (the optimizer's) set it once
                calls.set_pipeline(handle, pipe._internal)
                self._pass_pipeline = pipe
            calls.set_bind_group(handle, 0, group._internal, 0, calls.null)
            calls.dispatch(handle, *launch.groups)
        if self._profile is not None:
            self._end_pass()
        self.counters["dispatches"] += 1

    def keep(self, key: tuple, launch: Launch | None) -> Launch | None:
        """Keep an op's Launch under `key`, which names everything that decided it (the shader, the shapes, the
        parameters), and return it. The op looks there first:
        `launch = rt.launches.get(key) or rt.keep(key, rt.prepare(...))` prepares only on a miss."""
        self.launches[key] = launch
        _trim(self.launches)
        return launch

    def dispatch(self, module, entry: str, groups, bindings: dict, params=None) -> None:
        """Record one dispatch (`prepare`'s arguments, `bindings` mapping binding slots to arrays), made ready
        afresh: for ops whose shapes seldom repeat."""
        self.launch(self.prepare(module, entry, groups, tuple(bindings), params), bindings.values())

    # --- profiling: each dispatch in its own pass, timestamps at its start and end ---
    @property
    def profiling(self) -> bool:
        return self._profile is not None

    def profile(self, fn) -> list[dict]:
        """Run fn() with every dispatch timed on the GPU; GPU time per kernel, largest first."""
        if "timestamp-query" not in self.ctx.features:
            raise RuntimeError(f"{self.ctx.name} has no timestamp-query feature")
        if self.tape is not None:
            self.tape.broken = "the step profiles itself"
            return []
        self.flush()
        queries = self.device.create_query_set(type="timestamp", count=QUERY_CAPACITY)
        self._profile = {"queries": queries, "labels": [], "times": defaultdict(float), "calls": Counter()}
        try:
            fn()
            self._collect_timestamps()
        finally:
            profile, self._profile = self._profile, None
        rows = [{"kernel": k, "calls": profile["calls"][k], "ms": t / 1e6} for k, t in profile["times"].items()]
        return sorted(rows, key=lambda r: -r["ms"])

    def time_pass(self, fn, reps: int) -> float:
        """GPU milliseconds per call of fn() (which records dispatches), from `reps` calls recorded into one
        compute pass with timestamps at its start and end only: dispatches back to back with the barriers
        between them, as in a training step, without the per-dispatch passes and timestamps of `profile`
        (a few microseconds each, which would count against a kernel split into two dispatches)."""
        if "timestamp-query" not in self.ctx.features:
            raise RuntimeError(f"{self.ctx.name} has no timestamp-query feature")
        if self.tape is not None or self._profile is not None:
            raise RuntimeError("time_pass cannot run inside a captured step or a profile")
        self.flush()
        queries = self.device.create_query_set(type="timestamp", count=2)
        self._begin_pass((queries, 0, 1))
        for _ in range(reps):
            fn()
        start, end = self._timestamps(queries, 2)
        return float(end - start) / 1e6 / reps

    def _begin_timed_pass(self, label):
        if 2 * len(self._profile["labels"]) + 2 > QUERY_CAPACITY:
            self._collect_timestamps()
        self._end_pass()
        i = 2 * len(self._profile["labels"])
        self._profile["labels"].append(label)
        self._begin_pass((self._profile["queries"], i, i + 1))

    def _collect_timestamps(self):
        labels = self._profile["labels"]
        if not labels:
            return
        stamps = self._timestamps(self._profile["queries"], 2 * len(labels))
        for label, start, end in zip(labels, stamps[0::2], stamps[1::2]):
            self._profile["times"][label] += float(end - start)
            self._profile["calls"][label] += 1
        labels.clear()

    def _timestamps(self, queries, count: int) -> np.ndarray:
        """The first `count` timestamps of a query set, in nanoseconds, after the open pass ends (a read-back:
        the host waits for the GPU)."""
        resolved = self.device.create_buffer(size=8 * count,
                                             usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self._end_pass()
        if self.native is not None:
            self.native.resolve(self._encoder(), queries._internal, count, resolved._internal)
        else:
            self._encoder().resolve_query_set(queries, 0, count, resolved, 0)
        return self.read(GpuArray(resolved, (count,), np.dtype(np.uint64)))

    def flush(self) -> None:
        """Submit everything recorded so far (no waiting for the GPU). Everything that reaches the queue
        (writes, read-backs, destroying buffers) flushes first."""
        self._release_orphans()
        if self.encoder is None and not self.staged_copies:
            return
        self._encoder()  # records the staged copies, when they are all there is
        self._end_pass()
        self._upload_staged()
        encoder, self.encoder = self.encoder, None  # gone also when finish raises: the next op starts afresh
        if self.native is not None:
            self.native.submit([self.native.finish(encoder)])
        else:
            self.queue.submit([encoder.finish()])
        self.counters["submissions"] += 1

    def _encode_methods(self, pipe, group, groups):
        """`launch`'s commands through wgpu-py's methods (the direct calls' are inline there)."""
        if self.compute_pass is None:
            self._begin_pass()
        if pipe is not self._pass_pipeline:
            self.compute_pass.set_pipeline(pipe)
            self._pass_pipeline = pipe
        self.compute_pass.set_bind_group(0, group)
        self.compute_pass.dispatch_workgroups(*groups)

    def _encoder(self):
        if self.encoder is None:
            self.early_read = None  # a command after the replay might write its result
            self.encoder = self.native.encoder() if self.native is not None else self.device.create_command_encoder()
            for buffer, offset, at, nbytes in self.staged_copies:  # staged writes first: they came first
                self._copy(self.upload_buffer, at, buffer, offset, nbytes)
            self.staged_copies.clear()
        return self.encoder

    def _copy(self, source, source_offset: int, destination, offset: int, nbytes: int) -> None:
        """A buffer-to-buffer copy (wgpu buffers, byte counts), recorded after the open pass ends."""
        self._end_pass()
        if self.native is not None:
            self.native.copy(self._encoder(), source._internal, source_offset, destination._internal, offset, nbytes)
        else:
            self._encoder().copy_buffer_to_buffer(source, source_offset, destination, offset, nbytes)

    def _begin_pass(self, timestamps: tuple | None = None):
        """Open a compute pass, and return it; timestamps: (query set, index written at its start, at its end)."""
        encoder = self._encoder()
        if self.native is not None:
            self.compute_pass = self.native.begin_pass(
                encoder, None if timestamps is None else (timestamps[0]._internal, *timestamps[1:]))
        elif timestamps is None:
            self.compute_pass = encoder.begin_compute_pass()
        else:
            self.compute_pass = encoder.begin_compute_pass(timestamp_writes={
                "query_set": timestamps[0], "beginning_of_pass_write_index": timestamps[1],
                "end_of_pass_write_index": timestamps[2]})
        return self.compute_pass

    def _end_pass(self):
        if self.compute_pass is not None:
            compute_pass, self.compute_pass, self._pass_pipeline = self.compute_pass, None, None
            if self.native is not None:
                self.native.end_pass(compute_pass)
            else:
                compute_pass.end()


def _trim(cache: dict) -> None:
    """Forget a cache's oldest entry once it holds more than CACHE_SIZE (first in, first out: a hit costs
    nothing to record, and a hot entry that ages out is made again once)."""
    if len(cache) > CACHE_SIZE:
        del cache[next(iter(cache))]


def groups(n: int) -> int:
    """Workgroups of WG threads covering n elements (the 1-D kernels: common.wgsl's element_index)."""
    return -(-n // WG)


def grid(workgroups: int) -> tuple[int, int, int]:
    """A workgroup count laid out as (x, y, 1) with x <= 65535; kernels recover the flat index."""
    if workgroups <= MAX_GROUPS:
        return (workgroups, 1, 1)
    return (MAX_GROUPS, -(-workgroups // MAX_GROUPS), 1)
