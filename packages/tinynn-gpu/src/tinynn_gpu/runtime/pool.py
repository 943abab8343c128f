"""The pool of storage buffers under the arrays: buffers by size bucket, handed out lowest id first.

Reusing a buffer as soon as its array goes is safe: work on one queue runs in order, and uploads
(`queue.write_buffer`, which jumps ahead of commands not yet submitted) flush first. `memory_stats` counts the
bytes of array buffers in use, pooled, and the peak in use; an allocation that runs out of memory empties the
pool (the runtime's `empty_cache`, which first submits what is recorded) and tries again, and failing raises one
`TinynnError` with the numbers.
"""
from __future__ import annotations

import heapq
import math
from collections import defaultdict
from heapq import heappop

import numpy as np
from tinynn_gpu.runtime.webgpu import wgpu

from tinynn.errors import TinynnError
from tinynn_gpu.runtime.arrays import FLOAT32, SHAPES_CACHED, GpuArray, PooledArray, TooLarge, as_shape

STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


def _bucket(nbytes: int) -> int:
    """Round a size up to 1, 1.25, 1.5 or 1.75 times a power of two (at most 25% waste), 256 B at least."""
    if nbytes <= 256:
        return 256
    top = 1 << (nbytes - 1).bit_length()
    step = top // 8
    return -(-nbytes // step) * step


def _round4(n: int) -> int:
    return -(-n // 4) * 4


class BufferPool:
    """Storage buffers by size bucket, for arrays. `empty_cache`: what to call when the device runs out of memory
    (the runtime's: it submits what is recorded, then `destroy_pooled`)."""

    def __init__(self, device, max_binding: int, empty_cache):
        self.device = device
        self.empty_cache = empty_cache
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
        and gives one back, so the count is not kept there."""
        return sum(size * len(free) for size, free in self.free.items())

    def empty(self, shape, dtype=FLOAT32) -> GpuArray:
        # float32 kinds keyed by the shape alone (a shape is never a (shape, dtype) pair): an eager dispatch asks
        # for ~1 array, and the pair would be built and hashed each time
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

    def give_back(self, size: int, buffer) -> None:
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

    def destroy_pooled(self) -> set:
        """Destroy every pooled buffer; the set of them."""
        dead = set()
        for pool in self.free.values():
            for _, buffer in pool:
                buffer.destroy()  # wgpu frees it once the submitted work that uses it has finished
                dead.add(buffer)
            pool.clear()  # in place: `kinds` holds the heaps
        self.buffers -= dead
        return dead


