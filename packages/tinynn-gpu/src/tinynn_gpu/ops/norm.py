"""The gradients' global norm and its clip coefficient (norm.wgsl): multi_tensor.py's sums of squares over many
arrays per dispatch, then one workgroup's finish for both. Methods of the backend (backend.py's table)."""
from __future__ import annotations

from tinynn_gpu.runtime.arrays import bindable


def global_norm(self, arrays):
    return self._norm(arrays, None)[0]


def global_norm_and_clip(self, arrays, max_norm):
    return self._norm(arrays, max_norm)


def norm(self, arrays, max_norm):
    """The norm and, given max_norm, the clip coefficient: the sums of squares, then one finish for both."""
    partials, count = self.multi.sum_squares([bindable(a) for a in arrays], lambda n: self._empty((n,)))
    result = self._empty(())
    coefficient = self._empty(()) if max_norm is not None else self.rt.stand_in(1)
    self.rt.dispatch("norm", "norm_finish_main", 1, {"partials": partials, "norm": result, "coefficient": coefficient},
                     {"count": count, "clip": int(max_norm is not None), "max_norm": max_norm or 0.0})
    return result, (coefficient if max_norm is not None else None)
