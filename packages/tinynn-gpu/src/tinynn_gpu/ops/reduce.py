"""Sums and maxima over any axes (reduce.wgsl): adjacent reduced axes merge into one run, and each run is one
dispatch whatever the sizes. Methods of the backend (backend.py's table)."""
from __future__ import annotations

import math

from tinynn_gpu.ops import group_sum
from tinynn_gpu.ops.strided import contiguous_strides
from tinynn_gpu.runtime.arrays import bindable

SUM, MAX = 0, 1  # reduce.wgsl's op codes


def reduce(self, a, axes, keepdims, op):
    axes = sorted(ax % a.ndim for ax in (axes if isinstance(axes, (tuple, list)) else (axes,)))
    kept = tuple(1 if i in axes else n for i, n in enumerate(a.shape))
    shape, x = list(a.shape), a
    runs = []  # maximal runs of adjacent axes, reduced last run first so earlier indices stay valid
    for ax in axes:
        if runs and runs[-1][1] == ax - 1:
            runs[-1][1] = ax
        else:
            runs.append([ax, ax])
    for start, stop in reversed(runs):
        outer, r, inner = (math.prod(shape[:start]), math.prod(shape[start:stop + 1]), math.prod(shape[stop + 1:]))
        x = self._reduce_middle(x, outer, r, inner, op)
        shape = shape[:start] + shape[stop + 1:]
    if not runs:
        x = self._gather(a, 0, a.shape, contiguous_strides(a.shape))  # a copy, never an alias
    return x.view(kept if keepdims else tuple(shape))


def reduce_middle(self, a, outer, r, inner, op):
    """(outer, R, inner) -> (outer * inner,): one dispatch whatever the sizes."""
    out = self._empty((outer * inner,))
    shader = group_sum.shader(self.rt, "reduce")
    params = {"outer": outer, "r": r, "inner": inner, "op": op}
    if inner == 1:
        self.rt.dispatch(shader, "reduce_rows_main", outer, {"a": bindable(a), "out": out}, params)
    else:
        self.rt.dispatch(shader, "reduce_columns_main", outer * -(-inner // 32), {"a": bindable(a), "out": out}, params)
    return out


def sum(self, a, axes, keepdims=False):
    return self._reduce(a, axes, keepdims, SUM)


def max(self, a, axes, keepdims=False):
    return self._reduce(a, axes, keepdims, MAX)
