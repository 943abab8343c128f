"""Layout ops (strided.wgsl): a view of a contiguous array is (offset, shape, strides) in elements, a stride
negative where a slice steps backwards; permutes, broadcasts and basic slices all become such views, merged to at
most MAX_DIMS dims, and one kernel gathers a view into a new array or scatters an array into one. Each op is a
method of the backend (backend.py's table)."""
from __future__ import annotations

import numpy as np

from tinynn.backends import Backend
from tinynn_gpu.runtime.arrays import OnCpu, TooLarge, bindable_any
from tinynn_gpu.runtime.kernels import groups

MAX_DIMS = 6


def contiguous_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def merge_dims(shape, *stride_sets):
    """Drop size-1 dims and merge neighbours that are contiguous in every stride set (fewer loop dims)."""
    dims = [(n, [s[i] for s in stride_sets]) for i, n in enumerate(shape) if n != 1]
    merged = []
    for n, strides in dims:
        if merged and all(prev == cur * n for prev, cur in zip(merged[-1][1], strides)):
            merged[-1] = (merged[-1][0] * n, strides)
        else:
            merged.append((n, strides))
    if not merged:
        merged = [(1, [0] * len(stride_sets))]
    if len(merged) > MAX_DIMS:
        raise TooLarge(f"a layout of {len(merged)} irreducible dims exceeds the kernels' {MAX_DIMS}")
    shape_out = [n for n, _ in merged]
    return shape_out, [[s[k] for _, s in merged] for k in range(len(stride_sets))]


def is_basic(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return all(isinstance(i, (int, np.integer, slice)) or i is Ellipsis or i is None for i in items)


_views: dict = {}


def basic_view(shape, index):
    """(offset, shape, strides) of `array[index]` for a basic index, in elements, found by letting NumPy
    index a fake byte-strided array (never read: only its pointer arithmetic is used). Cached: a training
    step asks for the same few views every time."""
    key = (tuple(shape), repr(index))
    if key not in _views:
        base = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=key[0],
                                               strides=contiguous_strides(key[0]))
        view = base[index]
        offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        _views[key] = (offset, view.shape, view.strides)
    return _views[key]


def reshape(self, a, shape):
    return a.view(shape)


def gather(self, a, offset, shape, strides):
    out = self._empty(shape, a.dtype)
    merged, (view_strides,) = merge_dims(shape, strides)
    self.rt.dispatch("strided", "gather_main", groups(out.size), {"src": bindable_any(a), "dst": out},
                     {"n": out.size, "ndim": len(merged), "offset": offset, "shape": merged, "strides": view_strides})
    return out


def scatter(self, src, dst, offset, shape, strides):
    merged, (view_strides,) = merge_dims(shape, strides)
    self.rt.dispatch("strided", "scatter_main", groups(src.size), {"src": bindable_any(src), "dst": bindable_any(dst)},
                     {"n": src.size, "ndim": len(merged), "offset": offset, "shape": merged, "strides": view_strides})


def copy(self, src, dst):
    self._scatter(src, dst, 0, src.shape, contiguous_strides(src.shape))


def permute(self, a, axes):
    strides = contiguous_strides(a.shape)
    return self._gather(a, 0, tuple(a.shape[i] for i in axes), tuple(strides[i] for i in axes))


def broadcast_to(self, a, shape):
    shape = tuple(shape)
    lead = len(shape) - a.ndim
    src = contiguous_strides(a.shape)
    strides = tuple(0 if i < lead or a.shape[i - lead] == 1 else src[i - lead] for i in range(len(shape)))
    return self._gather(a, 0, shape, strides)


def getitem(self, a, index):
    if not is_basic(index):
        return Backend.getitem(self, a, index)
    offset, shape, strides = basic_view(a.shape, index)
    return self._gather(a, offset, shape, strides)


def getitem_backward(self, g, index, shape):
    if not is_basic(index):
        return Backend.getitem_backward(self, g, index, shape)
    out = self.full(shape, 0.0, g.dtype)
    offset, view_shape, strides = basic_view(tuple(shape), index)
    self._scatter(g, out, offset, view_shape, strides)
    return out


def concatenate(self, arrays, axis):
    if len({a.dtype for a in arrays}) > 1:
        raise OnCpu("concatenate of mixed dtypes")  # NumPy promotes; the copies move bits
    axis = axis % arrays[0].ndim
    shape = list(arrays[0].shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    out = self._empty(shape, arrays[0].dtype)
    strides, start = contiguous_strides(shape), 0
    for a in arrays:
        self._scatter(a, out, start * strides[axis], a.shape, strides)
        start += a.shape[axis]
    return out
