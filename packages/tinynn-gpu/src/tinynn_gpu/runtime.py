"""The runtime under every GPU op: arrays that live in GPU buffers, a buffer pool, the caches, and the
recorder that batches dispatches into one compute pass and submits only when it must.

- `GpuArray`: shape + dtype over a pooled buffer (contiguous, so reshape is free). When the last array on
  a buffer is dropped, the buffer goes back to the pool. Reusing it at once is safe: work on one queue runs
  in order, and uploads (`queue.write_buffer`, which jumps ahead of unsubmitted commands) flush first.
- Memory: `memory_stats` counts the bytes of array buffers in use, pooled, and the peak in use;
  `empty_cache` destroys the pooled ones, and so does an allocation that runs out of memory before it
  tries again and, failing, raises one `TinynnError` with the numbers.
- Caches: shader modules by the hash of their WGSL, pipelines by (module, entry point); uniform buffers
  by their bytes; bind groups by (pipeline, buffers), because creating a bind group costs ~50 us and a
  training step repeats them all.
- Recording goes through wgpu-native's C functions directly where `native.probe` found them working
  (a third of wgpu-py's host cost per dispatch), else through wgpu-py's methods. A replayed step is
  compiled once into flat lists of what those calls take (`_compile`).
- The host waits only in `read` (and `sync`, which reads 4 bytes): `queue.on_submitted_work_done_sync()`
  is broken in wgpu 0.32, and mapping a buffer written by the last submission waits for all before it.
"""
from __future__ import annotations

import hashlib
import heapq
import math
from collections import Counter, OrderedDict, defaultdict

import numpy as np
import wgpu

from tinynn.errors import TinynnError
from tinynn.numpy_backend import EMBEDDING_RANGE, TARGET_RANGE
from tinynn_gpu import native
from tinynn_gpu.params import ParamsLayout

STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
MAX_GROUPS = 65535  # per dispatch dimension
WG = 256  # threads per workgroup of the 1-D kernels
CACHE_SIZE = 8192
QUERY_CAPACITY = 4096  # WebGPU's most timestamps in one query set
# Bits a kernel sets in the error-flags word (atomicOr; embedding.wgsl, cross_entropy.wgsl), and the error
# each becomes: `read` copies the word back with every read-back and raises, so a bad input surfaces at the
# step's one read-back with the NumPy backend's message, and never as a silently wrong number.
KERNEL_ERRORS = {1: EMBEDDING_RANGE, 2: TARGET_RANGE}
# dispatches per submission in a replay. H200, lesson step, direct calls (experiments/replay_host_cost.py):
# 16 gave 5.80 ms, 32 5.67, 64 5.77, 128 6.33, the whole step in one submission 6.73
REPLAY_CHUNK = 32


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


class TooLarge(Exception):
    """An array exceeds the device's storage-binding limit: the backend computes that op on the CPU."""


class OnCpu(Exception):
    """These operands need the NumPy reference (an int32 array where a kernel reads float32, mixed dtypes, a
    head size no kernel takes): raised before the op records a dispatch, so the fallback never repeats part
    of the work."""


class GpuArray:
    """An array in a GPU buffer; or, when it is too large to bind, on the host (`buffer` None, `host` set)."""
    __slots__ = ("buffer", "shape", "dtype", "_owner", "host", "__weakref__")

    def __init__(self, buffer, shape, dtype, owner=None, host=None):
        self.buffer = buffer
        self.shape = tuple(map(int, shape))
        self.dtype = np.dtype(dtype)
        self._owner = owner  # a _Lease that returns the buffer to the pool when the last array goes
        self.host = host

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def view(self, shape) -> GpuArray:
        host = None if self.host is None else self.host.reshape(shape)
        return GpuArray(self.buffer, shape, self.dtype, self._owner, host)

    def __repr__(self):
        return f"GpuArray(shape={self.shape}, dtype={self.dtype})"


class _Lease:
    """Ties a pooled buffer to the arrays that share it: when the last of them goes, so does the lease, and
    the buffer goes back to the pool (`__del__`: a third of `weakref.finalize`'s cost). An array in a
    reference cycle takes its lease into the cycle collector's garbage; the runtime holds every buffer
    (`Runtime.buffers`), so the buffer itself is never finalized there before its lease pools it."""
    __slots__ = ("runtime", "size", "buffer", "__weakref__")

    def __init__(self, runtime, size, buffer):
        self.runtime, self.size, self.buffer = runtime, size, buffer

    def __del__(self):
        self.runtime._give_back(self.size, self.buffer)


def _bucket(nbytes: int) -> int:
    """Round a size up to 1, 1.25, 1.5 or 1.75 times a power of two (at most 25% waste), 256 B at least."""
    if nbytes <= 256:
        return 256
    top = 1 << (nbytes - 1).bit_length()
    step = top // 8
    return -(-nbytes // step) * step


class Runtime:
    def __init__(self, ctx):
        self.ctx = ctx
        self.device = ctx.device
        self.queue = ctx.device.queue
        self.max_binding = ctx.limits["max-storage-buffer-binding-size"]
        self.free = defaultdict(list)  # bucket size -> heap of (uid, buffer)
        self.bucket_sizes = {}  # nbytes -> its pool's buffer size: an eval forward allocates ~2 arrays a dispatch
        # Every storage buffer made, held here so that none can be finalized by Python's cycle collector
        # before the lease that returns it to the pool: a lease's __del__ would then pool a released buffer.
        self.buffers = set()
        self._push = heapq.heappush  # held: a lease dropped at interpreter exit may outlive the module's globals
        self.shaders = {}  # hash of the WGSL -> Shader
        self.kernels = {}  # kernel file name -> Shader
        self.entry_points = {}  # (kernel file name or Shader, entry point) -> (Shader, pipeline): one look-up
        self.uniforms = OrderedDict()
        self.bind_groups = OrderedDict()
        self.staging = {}  # bucket size -> MAP_READ buffer for read-backs
        self.encoder = None
        self.compute_pass = None
        self._pass_pipeline = None  # the pipeline set in the open pass
        self.counters = Counter()
        self._sync_source = None
        self._profile = None  # while profiling: {"queries", "labels", "times"}
        self.tape = None  # while capturing a step (capture.py): the Tape recording it
        self.error_flags = self.device.create_buffer(size=4, usage=STORAGE_USAGE)  # KERNEL_ERRORS' bits
        self.in_use_bytes = self.pooled_bytes = self.peak_bytes = 0
        self.native, self.native_reason = None, ""
        self.use_native(*native.probe(self.device))

    def use_native(self, calls, reason: str = "") -> None:
        """Record through wgpu-native's C functions (`calls`), or through wgpu-py's methods when calls is None
        (then `reason` says why). Tests switch paths with it."""
        self.flush()
        self.native, self.native_reason = calls, reason
        self._encode = self._encode_native if calls else self._encode_methods

    def describe(self) -> dict:
        how = "direct wgpu-native calls" if self.native else f"wgpu-py methods ({self.native_reason})"
        return {"recording": how}

    # --- memory ---
    def empty(self, shape, dtype=np.float32) -> GpuArray:
        dtype = np.dtype(dtype)
        nbytes = max(4, math.prod(shape) * dtype.itemsize)
        if nbytes > self.max_binding:
            raise TooLarge(f"{nbytes} bytes exceed the storage-binding limit of {self.max_binding}")
        size = self.bucket_sizes.get(nbytes)
        if size is None:
            size = self.bucket_sizes[nbytes] = min(_bucket(nbytes), self.max_binding)
        pool = self.free[size]
        # Lowest id first, not last-freed first: the choice then depends only on which buffers are free,
        # not on the order Python freed them, so every training step reuses the same buffers in the same
        # places and finds its bind groups in the cache.
        if pool:
            buffer = heapq.heappop(pool)[1]
            self.pooled_bytes -= size
        else:
            buffer = self._create_buffer(size)
        self.in_use_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.in_use_bytes)
        return GpuArray(buffer, shape, dtype, _Lease(self, size, buffer))

    def _give_back(self, size: int, buffer) -> None:
        self.in_use_bytes -= size
        self.pooled_bytes += size
        self._push(self.free[size], (buffer.uid, buffer))

    def _create_buffer(self, size: int):
        """A new storage buffer; out of memory, the pool is emptied and the allocation tried once more."""
        try:
            buffer = self.device.create_buffer(size=size, usage=STORAGE_USAGE)
        except wgpu.GPUOutOfMemoryError:
            self.empty_cache()
            try:
                buffer = self.device.create_buffer(size=size, usage=STORAGE_USAGE)
            except wgpu.GPUOutOfMemoryError:
                raise TinynnError(f"out of GPU memory allocating {size:,} bytes, with {self.in_use_bytes:,} "
                                  "bytes in use by arrays; try a smaller batch_size (or model)") from None
        self.buffers.add(buffer)
        return buffer

    def claim(self, buffers: set) -> list:
        """Take these buffers out of the pool for a captured step (counted in use); the ones found."""
        found = []
        for size, pool in self.free.items():
            kept = [entry for entry in pool if entry[1] not in buffers]
            if len(kept) < len(pool):
                found += [entry[1] for entry in pool if entry[1] in buffers]
                heapq.heapify(kept)
                pool[:] = kept
        claimed = sum(buffer.size for buffer in found)
        self.pooled_bytes -= claimed
        self.in_use_bytes += claimed
        return found

    def memory_stats(self, reset_peak: bool = False) -> dict:
        """Bytes of array buffers in use, kept in the pool for reuse, and the most in use at once (since the
        start or the last reset_peak, which starts the next peak from what is in use now)."""
        stats = {"in_use_bytes": self.in_use_bytes, "pooled_bytes": self.pooled_bytes,
                 "peak_bytes": self.peak_bytes}
        if reset_peak:
            self.peak_bytes = self.in_use_bytes
        return stats

    def empty_cache(self) -> None:
        """Destroy the pooled buffers and the read-back staging buffers, giving their memory to the driver."""
        self.flush()  # a pooled buffer may be named by commands not yet submitted
        dead = set()
        for pool in self.free.values():
            for _, buffer in pool:
                buffer.destroy()  # wgpu frees it once the submitted work that uses it has finished
                dead.add(buffer)
        self.buffers -= dead
        for buffer in self.staging.values():
            buffer.destroy()
        self.free.clear()
        self.staging.clear()
        self.pooled_bytes = 0
        for key in [k for k in self.bind_groups if any(buf in dead for _, buf in k[1:])]:
            del self.bind_groups[key]  # they name destroyed buffers

    def copy(self, arr: GpuArray) -> GpuArray:
        """A new array holding arr's values, copied on the GPU in order with the work recorded so far."""
        out = self.empty(arr.shape, arr.dtype)
        if self.tape is not None:
            self.tape.broken = "the step copies an array"
        self._end_pass()
        self._encoder().copy_buffer_to_buffer(arr.buffer, 0, out.buffer, 0, _round4(max(4, arr.nbytes)))
        return out

    def upload(self, x: np.ndarray) -> GpuArray:
        arr = self.empty(x.shape, x.dtype)
        self.write(arr, x)
        return arr

    def write(self, arr: GpuArray, x: np.ndarray, start: int | None = None) -> None:
        """Overwrite arr's buffer with x (same byte size); with `start`, x's elements from arr's flat element
        start on (the rest of arr kept)."""
        data = np.ascontiguousarray(x, dtype=arr.dtype)  # written from its memory: no bytes copy (43 MB: 48 ms)
        if (data.nbytes != arr.nbytes) if start is None else not 0 <= start <= arr.size - data.size:
            raise ValueError(f"cannot write {x.shape} {x.dtype} into a {arr.shape} {arr.dtype} array"
                             + ("" if start is None else f" at element {start}"))
        self.flush()  # queue.write_buffer runs before commands not yet submitted: submit those first
        if data.nbytes:
            self.queue.write_buffer(arr.buffer, (start or 0) * arr.dtype.itemsize, data)
        self.counters["uploads"] += 1
        if self.tape is not None:  # inside a captured step this is a constant: replay writes the same bytes
            self.tape.events.append(("write", arr.buffer, data.tobytes()))
            self.tape.hold(arr)

    def read(self, arr: GpuArray, out: np.ndarray | None = None, start: int | None = None) -> np.ndarray:
        """Copy an array back to the host (into `out` when given): the one place the host waits for the GPU.
        With `start`, only out.size elements from arr's flat element start on come back, into out."""
        if self.tape is not None:
            self.tape.broken = "the step reads a value back"
        if start is None:
            out = np.empty(arr.shape, arr.dtype) if out is None else out
            start = 0
        elif not 0 <= start <= arr.size - out.size:
            raise ValueError(f"cannot read {out.size} elements at element {start} of a {arr.shape} array")
        nbytes = out.size * arr.dtype.itemsize
        if nbytes == 0:
            return out
        flags_at = _round4(nbytes)  # the kernels' error flags come back behind the data
        size = _bucket(flags_at + 4)
        staging = self.staging.get(size)
        if staging is None:
            staging = self.staging[size] = self.device.create_buffer(
                size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        self._end_pass()
        self._encoder().copy_buffer_to_buffer(arr.buffer, start * arr.dtype.itemsize, staging, 0, flags_at)
        self._encoder().copy_buffer_to_buffer(self.error_flags, 0, staging, flags_at, 4)
        self.flush()
        staging.map_sync(wgpu.MapMode.READ, 0, flags_at + 4)
        mapped = staging.read_mapped(0, flags_at + 4, copy=False)  # copied once, below, before unmap
        flags = int.from_bytes(mapped[flags_at:], "little")
        out[...] = np.frombuffer(mapped, dtype=arr.dtype, count=out.size).reshape(out.shape)
        del mapped
        staging.unmap()
        self.counters["host_syncs"] += 1
        if flags:
            self.queue.write_buffer(self.error_flags, 0, bytes(4))  # raised once
            raise TinynnError("; ".join(msg for bit, msg in KERNEL_ERRORS.items() if flags & bit))
        return out

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
            module = module or self.device.create_shader_module(label=label, code=code)
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
            buf = self.device.create_buffer_with_data(data=data, usage=wgpu.BufferUsage.UNIFORM)
            self.uniforms[data] = buf
            if len(self.uniforms) > CACHE_SIZE:
                self.uniforms.popitem(last=False)
        else:
            self.uniforms.move_to_end(data)
        return buf

    def bind_group(self, pipeline, slots):
        """The bind group of these (binding slot, buffer) pairs.
        Keyed by the objects, in the caller's order: no sorting, and a key keeps its buffers alive (a call
        site passes its slots in one order; another order costs one more bind group, once)."""
        key = (pipeline, *slots)
        group = self.bind_groups.get(key)
        if group is None:
            entries = [{"binding": slot, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
                       for slot, buf in slots]
            group = self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
            self.bind_groups[key] = group
            self.counters["bind_groups_created"] += 1
            if len(self.bind_groups) > CACHE_SIZE:
                self.bind_groups.popitem(last=False)
        else:
            self.bind_groups.move_to_end(key)
        return group

    # --- recording ---
    def dispatch(self, module, entry: str, groups, bindings: dict, params=None):
        """Record one dispatch of `entry` in `module` (a kernel file's name, or a Shader from `shader`).
        `bindings` maps binding slots to GpuArrays (or raw buffers); `params` (a dict of the module's
        `struct Params` fields) becomes the uniform at slot 3; `groups` is a workgroup count or an
        (x, y, z) tuple."""
        if isinstance(groups, int):
            groups = grid(groups)
        if 0 in groups:
            return
        found = self.entry_points.get((module, entry))
        if found is None:
            shader = module if isinstance(module, Shader) else self.kernel(module)
            found = self.entry_points[(module, entry)] = (shader, self.pipeline(shader, entry))
        shader, pipe = found
        slots = [(slot, getattr(v, "buffer", v)) for slot, v in bindings.items()]
        if shader.params is not None:
            slots.append((3, self.uniform(shader.params.pack(params or {}))))
        elif params:
            raise ValueError(f"{shader.label} declares no struct Params, but was given {params}")
        group = self.bind_group(pipe, slots)
        if self.tape is not None:
            self.tape.events.append(("dispatch", pipe, group, tuple(groups)))
            for value in bindings.values():
                self.tape.hold(value)
        if self._profile is not None:
            self._begin_timed_pass(f"{shader.label}.{entry}")
        self._encode(pipe, group, groups)
        self.counters["dispatches"] += 1
        if self._profile is not None:
            self._end_pass()

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

    def _begin_timed_pass(self, label):
        if 2 * len(self._profile["labels"]) + 2 > QUERY_CAPACITY:
            self._collect_timestamps()
        self._end_pass()
        i = 2 * len(self._profile["labels"])
        self._profile["labels"].append(label)
        self.compute_pass = self._encoder().begin_compute_pass(timestamp_writes={
            "query_set": self._profile["queries"], "beginning_of_pass_write_index": i,
            "end_of_pass_write_index": i + 1})

    def _collect_timestamps(self):
        labels = self._profile["labels"]
        if not labels:
            return
        resolved = self.device.create_buffer(size=16 * len(labels),
                                             usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self._end_pass()
        self._encoder().resolve_query_set(self._profile["queries"], 0, 2 * len(labels), resolved, 0)
        stamps = self.read(GpuArray(resolved, (2 * len(labels),), np.uint64))  # nanoseconds
        for label, start, end in zip(labels, stamps[0::2], stamps[1::2]):
            self._profile["times"][label] += float(end - start)
            self._profile["calls"][label] += 1
        labels.clear()

    def replay(self, tape) -> None:
        """Re-encode a captured step: the same dispatches and writes, no Python autograd, no cache look-ups.
        Submitted every REPLAY_CHUNK dispatches, so the GPU starts on the step while the rest is encoded."""
        direct = self.native is not None
        program = tape.programs.get(direct)
        if program is None:
            program = tape.programs[direct] = _compile(tape.events, direct)
        record = self._replay_native if direct else self._replay_methods
        for kind, first, second in program:
            self.flush()
            if kind == "write":
                self.queue.write_buffer(first, 0, second)
            else:
                self.compute_pass = self._encoder().begin_compute_pass()
                record(self.compute_pass, first)
        self._pass_pipeline = None  # the replay set its pipelines by handle: the next dispatch sets its own
        self.counters["dispatches"] += tape.dispatches
        self.counters["replays"] += 1

    def _replay_native(self, compute_pass, runs):
        calls, handle = self.native, compute_pass._internal
        set_pipeline, set_bind_group, dispatch, null = (calls.set_pipeline, calls.set_bind_group, calls.dispatch,
                                                        calls.null)
        for pipe, dispatches in runs:
            set_pipeline(handle, pipe)
            for group, x, y, z in dispatches:
                set_bind_group(handle, 0, group, 0, null)
                dispatch(handle, x, y, z)

    @staticmethod
    def _replay_methods(compute_pass, runs):
        set_pipeline, set_bind_group, dispatch = (compute_pass.set_pipeline, compute_pass.set_bind_group,
                                                  compute_pass.dispatch_workgroups)
        for pipe, dispatches in runs:
            set_pipeline(pipe)
            for group, x, y, z in dispatches:
                set_bind_group(0, group)
                dispatch(x, y, z)

    def flush(self) -> None:
        """Submit everything recorded so far (no waiting)."""
        if self.encoder is None:
            return
        self._end_pass()
        self.queue.submit([self.encoder.finish()])
        self.encoder = None
        self.counters["submissions"] += 1

    def _encode_native(self, pipe, group, groups):
        if self.compute_pass is None:
            self.compute_pass = self._encoder().begin_compute_pass()
        calls, handle = self.native, self.compute_pass._internal
        if pipe is not self._pass_pipeline:  # runs of one kernel (the optimizer's) set it once
            calls.set_pipeline(handle, pipe._internal)
            self._pass_pipeline = pipe
        calls.set_bind_group(handle, 0, group._internal, 0, calls.null)
        calls.dispatch(handle, *groups)

    def _encode_methods(self, pipe, group, groups):
        if self.compute_pass is None:
            self.compute_pass = self._encoder().begin_compute_pass()
        if pipe is not self._pass_pipeline:
            self.compute_pass.set_pipeline(pipe)
            self._pass_pipeline = pipe
        self.compute_pass.set_bind_group(0, group)
        self.compute_pass.dispatch_workgroups(*groups)

    def _encoder(self):
        if self.encoder is None:
            self.encoder = self.device.create_command_encoder()
        return self.encoder

    def _end_pass(self):
        if self.compute_pass is not None:
            self.compute_pass.end()
            self.compute_pass = None
            self._pass_pipeline = None


def _compile(events, direct: bool) -> list[tuple]:
    """A tape's events as the replay runs them: ("write", buffer, bytes) and ("dispatches", runs, None), at
    most REPLAY_CHUNK dispatches each, a run being (pipeline, [(bind group, x, y, z), ...]) under one
    pipeline. Direct calls take native handles; the tape's events keep their objects (and so the handles)
    alive."""
    handle = (lambda obj: obj._internal) if direct else (lambda obj: obj)
    program, count, last, runs = [], REPLAY_CHUNK, None, None
    for event in events:
        if event[0] == "write":
            program.append(event)
            count = REPLAY_CHUNK  # a write submits what came before it: start a new chunk after it
            continue
        _, pipe, group, (x, y, z) = event
        if count == REPLAY_CHUNK:
            runs, count, last = [], 0, None
            program.append(("dispatches", runs, None))
        if pipe is not last:
            runs.append((handle(pipe), []))
            last = pipe
        runs[-1][1].append((handle(group), x, y, z))
        count += 1
    return program


def groups(n: int) -> int:
    """Workgroups of WG threads covering n elements (the 1-D kernels: common.wgsl's element_index)."""
    return -(-n // WG)


def grid(workgroups: int) -> tuple[int, int, int]:
    """A workgroup count laid out as (x, y, 1) with x <= 65535; kernels recover the flat index."""
    if workgroups <= MAX_GROUPS:
        return (workgroups, 1, 1)
    return (MAX_GROUPS, -(-workgroups // MAX_GROUPS), 1)


def _round4(n: int) -> int:
    return -(-n // 4) * 4
