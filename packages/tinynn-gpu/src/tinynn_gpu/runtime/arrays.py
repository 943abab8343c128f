"""GPU arrays: `GpuArray` (shape and dtype over a buffer, or a host copy where it is too large to bind),
`PooledArray` (one that holds a buffer of the pool), the two refusals that send an op to the NumPy reference
(`TooLarge`, `OnCpu`), and the checks a kernel's operands pass (`bindable`, `bindable_any`, and `check_dtypes` for
the kernels that read float32 values by int32 indices)."""
from __future__ import annotations

import math

import numpy as np

FLOAT32 = np.dtype(np.float32)  # compared as a dtype: comparing with the type np.float32 converts it each time
INT32 = np.dtype(np.int32)
KERNEL_DTYPES = (FLOAT32, INT32)  # what GPU buffers hold; arrays of other dtypes live on the host (backend.py)


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
    One object per allocation, not a lease shared by the array and its views: fewer objects per eager dispatch.
    An array in a reference cycle is finalized by the cycle collector; the runtime holds every buffer
    (`BufferPool.buffers`), so the buffer itself is never finalized there before the array pools it.
    `entry` is the buffer's (uid, buffer) in the pool's heaps, made once per buffer, not per array; `free` the heap it
    goes back to, `bucket` its size."""
    __slots__ = ("pool", "free", "bucket", "entry")

    def __init__(self, shape: tuple, dtype: np.dtype, pool, free, bucket: int, entry: tuple):
        super().__init__(entry[1], shape, dtype)
        self.pool, self.free, self.bucket, self.entry = pool, free, bucket, entry

    def __del__(self):
        pool = self.pool
        pool.in_use_bytes -= self.bucket
        pool._push(self.free, self.entry)


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


def bindable(a: GpuArray) -> GpuArray:
    """An array a float32 kernel can bind; a host-resident one raises TooLarge, any other dtype OnCpu, so the op
    runs on the CPU instead (the dtype by identity first: np.dtype's == converts its operand)."""
    if a.buffer is None:
        raise TooLarge("array lives on the host") if a.dtype in KERNEL_DTYPES else OnCpu(f"no {a.dtype} kernel")
    if a.dtype is not FLOAT32 and a.dtype != FLOAT32:
        raise OnCpu(f"no {a.dtype} kernel")
    return a


def bindable_any(a: GpuArray) -> GpuArray:
    """`bindable` for a kernel that reads int32 arrays too (an index, a layout copy): the op checks dtypes."""
    if a.buffer is None:
        raise TooLarge("array lives on the host") if a.dtype in KERNEL_DTYPES else OnCpu(f"no {a.dtype} kernel")
    return a


def check_dtypes(name: str, *arrays: GpuArray) -> None:
    """The operands of a kernel reading values by index (an embedding, a cross entropy): float32 values, then one
    integer index array; other dtypes raise OnCpu naming the op."""
    *values, index = arrays
    if any(a.dtype != np.float32 for a in values) or index.dtype.kind != "i":
        raise OnCpu(f"{name} of {', '.join(str(a.dtype) for a in arrays)}")
