"""GPU arrays and the pool of buffers under them.

- `GpuArray`: shape + dtype over a buffer (contiguous, so reshape is a view that shares it).
- `PooledArray`: the GpuArray that holds a buffer of the pool. When it and its views are dropped, the buffer
  goes back to the pool. Reusing it at once is safe: work on one queue runs in order, and uploads
  (`queue.write_buffer`, which jumps ahead of commands not yet submitted) flush first.
- `BufferPool` (the runtime extends it): buffers by size bucket, handed out lowest id first; `memory_stats`
  counts the bytes of array buffers in use, pooled, and the peak in use; an allocation that runs out of
  memory empties the pool (`empty_cache`) and tries again, and failing raises one `TinynnError` with the
  numbers.
"""
from __future__ import annotations

import heapq
import math
from collections import defaultdict
from heapq import heappop

import numpy as np
import wgpu

from tinynn.errors import TinynnError

STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
FLOAT32 = np.dtype(np.float32)  # compared as a dtype: comparing with the type np.float32 converts it each time


class TooLarge(Exception):
    """An array exceeds the device's storage-binding limit: the backend computes that op on the CPU."""


class OnCpu(Exception):
    """These operands need the NumPy reference (an int32 array where a kernel reads float32, mixed dtypes, a
    head size no kernel takes): raised before the op records a dispatch, so the fallback never repeats part
    of the work."""


class GpuArray:
    """An array in a GPU buffer; or, when it is too large to bind, on the host (`buffer` None, `host` set).
    Made with its shape a tuple of Python ints and its dtype a np.dtype (`as_shape`, `np.dtype`): the pool
    makes ~1 array per eager dispatch from shapes it has converted once (`BufferPool.kinds`). `base` (NumPy's
    name): the array whose buffer a view shares, which it keeps alive; None for the array that holds it."""
    __slots__ = ("buffer", "shape", "dtype", "base", "host", "__weakref__")

    def __init__(self, buffer, shape: tuple, dtype: np.dtype, base=None, host=None):
        self.buffer = buffer
        self.shape = shape
        self.dtype = dtype
        self.base = base
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
        if self.host is not None:
            host = self.host.reshape(shape)
            return GpuArray(None, host.shape, self.dtype, host=host)
        return GpuArray(self.buffer, as_shape(shape), self.dtype, self.base or self)

    def __repr__(self):
        return f"GpuArray(shape={self.shape}, dtype={self.dtype})"


class PooledArray(GpuArray):
    """An array holding a buffer of the pool, which gets the buffer back when this array goes (`__del__`: a third
    of `weakref.finalize`'s cost); its views hold it (`base`), so that is when the last array on the buffer goes.
    One object per allocation: a separate lease shared by the array and its views cost ~1.0k more instructions an
    eager dispatch (~2%; `experiments/eager_instructions.py`).
    An array in a reference cycle is finalized by the cycle collector; the runtime holds every buffer
    (`BufferPool.buffers`), so the buffer itself is never finalized there before the array pools it.
    `entry` is the buffer's (uid, buffer) in the pool's heaps, made once per buffer, not per array; `free` the heap it
    goes back to, `bucket` its size."""
    __slots__ = ("pool", "free", "bucket", "entry")

    def __init__(self, shape: tuple, dtype: np.dtype, pool, free, bucket: int, entry: tuple):
        # GpuArray.__init__'s fields set here, not through its call: one call fewer per allocation
        self.buffer, self.shape, self.dtype, self.base, self.host = entry[1], shape, dtype, None, None
        self.pool, self.free, self.bucket, self.entry = pool, free, bucket, entry

    def __del__(self):
        pool = self.pool
        pool.in_use_bytes -= self.bucket
        pool._push(self.free, self.entry)


def _bucket(nbytes: int) -> int:
    """Round a size up to 1, 1.25, 1.5 or 1.75 times a power of two (at most 25% waste), 256 B at least."""
    if nbytes <= 256:
        return 256
    top = 1 << (nbytes - 1).bit_length()
    step = top // 8
    return -(-nbytes // step) * step


def _round4(n: int) -> int:
    return -(-n // 4) * 4


_shapes: dict = {}  # a shape as given -> the same shape as a tuple of Python ints
SHAPES_CACHED = 4096


def as_shape(shape) -> tuple:
    """shape as a tuple of Python ints. Every eager op makes arrays of a few shapes, and looking one up
    costs a fifth of converting it (equal shapes, e.g. of NumPy ints, convert alike)."""
    try:
        return _shapes[shape]
    except KeyError:
        if len(_shapes) >= SHAPES_CACHED:  # a growing generation window makes a new shape per token
            _shapes.clear()
        found = _shapes[shape] = tuple(map(int, shape))
        return found
    except TypeError:  # unhashable: a list
        return tuple(map(int, shape))


class BufferPool:
    """Storage buffers by size bucket, for arrays. The runtime extends it: `empty_cache`, which must first
    submit what is recorded, is the runtime's."""

    def __init__(self, device, max_binding: int):
        self.device = device
        self.max_binding = max_binding
        self.free = defaultdict(list)  # bucket size -> heap of (uid, buffer)
        # a float32 shape, or (shape, dtype), as asked -> `_kind`'s answer: an eval forward allocates ~1 array a
        # dispatch
        self.kinds = {}
        # Every storage buffer made, held here so that none can be finalized by Python's cycle collector
        # before the array that returns it to the pool: that array's __del__ would then pool a released buffer.
        self.buffers = set()
        self._push = heapq.heappush  # held: an array dropped at interpreter exit may outlive the module's globals
        self.in_use_bytes = self.peak_bytes = 0

    @property
    def pooled_bytes(self) -> int:
        """Bytes of the buffers in the pool, counted when asked: every eager dispatch takes one buffer from the pool
        and gives one back, and keeping a count there cost ~1.5% of its host time (2-core machine)."""
        return sum(size * len(free) for size, free in self.free.items())

    def empty(self, shape, dtype=FLOAT32) -> GpuArray:
        # float32 kinds keyed by the shape alone (a shape is never a (shape, dtype) pair): an eager dispatch asks
        # for ~1 array, and building and hashing the pair cost ~2% of its host time
        key = shape if dtype is FLOAT32 else (shape, dtype)
        try:
            shape, dtype, nbytes, size, free = self.kinds[key]
        except KeyError:
            if len(self.kinds) >= SHAPES_CACHED:
                self.kinds.clear()
            shape, dtype, nbytes, size, free = self.kinds[key] = self._kind(shape, dtype)
        except TypeError:  # an unhashable shape: a list
            shape, dtype, nbytes, size, free = self._kind(shape, dtype)
        if size > self.max_binding:  # the limit in force now
            if nbytes > self.max_binding:
                raise TooLarge(f"{nbytes} bytes exceed the storage-binding limit of {self.max_binding}")
            size = self.max_binding  # a bucket past the limit holds arrays up to the limit
            free = self.free[size]
        # Lowest id first, not last-freed first: the choice then depends only on which buffers are free,
        # not on the order Python freed them, so every training step reuses the same buffers in the same
        # places and finds its bind groups in the cache.
        if free:
            entry = heappop(free)
        else:
            buffer = self._create_buffer(size)
            entry = (buffer.uid, buffer)
        self.in_use_bytes += size
        if self.in_use_bytes > self.peak_bytes:
            self.peak_bytes = self.in_use_bytes
        return PooledArray(shape, dtype, self, free, size, entry)

    def _kind(self, shape, dtype) -> tuple:
        """(shape as ints, np.dtype, bytes, its size bucket, the bucket's free heap) of an array."""
        shape, dtype = as_shape(shape), np.dtype(dtype)
        nbytes = max(4, math.prod(shape) * dtype.itemsize)
        size = _bucket(nbytes)
        return shape, dtype, nbytes, size, self.free[size]

    def _give_back(self, size: int, buffer) -> None:
        self.in_use_bytes -= size
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
        self.in_use_bytes += sum(buffer.size for buffer in found)
        return found

    def memory_stats(self, reset_peak: bool = False) -> dict:
        """Bytes of array buffers in use, kept in the pool for reuse, and the most in use at once (since the
        start or the last reset_peak, which starts the next peak from what is in use now)."""
        stats = {"in_use_bytes": self.in_use_bytes, "pooled_bytes": self.pooled_bytes,
                 "peak_bytes": self.peak_bytes}
        if reset_peak:
            self.peak_bytes = self.in_use_bytes
        return stats

    def _destroy_pooled(self) -> set:
        """Destroy every pooled buffer; the set of them."""
        dead = set()
        for pool in self.free.values():
            for _, buffer in pool:
                buffer.destroy()  # wgpu frees it once the submitted work that uses it has finished
                dead.add(buffer)
            pool.clear()  # in place: `kinds` holds the heaps
        self.buffers -= dead
        return dead


def bindable(a: GpuArray) -> GpuArray:
    """An array a float32 kernel can bind; a host-resident one raises TooLarge, any other dtype OnCpu, so the op
    runs on the CPU instead (the dtype by identity first: np.dtype's == converts its operand)."""
    if a.buffer is None:
        raise TooLarge("array lives on the host")
    if a.dtype is not FLOAT32 and a.dtype != FLOAT32:
        raise OnCpu(f"no {a.dtype} kernel")
    return a


def bindable_any(a: GpuArray) -> GpuArray:
    """`bindable` for a kernel that reads int32 arrays too (an index, a layout copy): the op checks dtypes."""
    if a.buffer is None:
        raise TooLarge("array lives on the host")
    return a
