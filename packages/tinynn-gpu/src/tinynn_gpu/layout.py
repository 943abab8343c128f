"""Array layouts for the strided kernels: a view of a contiguous array is (offset, shape, strides) in
elements; permutes, broadcasts and basic slices all become such views, merged to at most MAX_DIMS dims."""
from __future__ import annotations

import numpy as np

from tinynn_gpu.runtime import TooLarge

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
