"""Cross-entropy over rows of logits (cross_entropy.wgsl, compiled through group_sum.py): the forward a row team
per row, then one workgroup for the mean; the backward one thread an element. A target out of range sets a bit
of the runtime's error flags, raised at the next read-back. Methods of the backend (backend.py's table)."""
from __future__ import annotations

import numpy as np

from tinynn_gpu.ops import group_sum
from tinynn_gpu.runtime.arrays import OnCpu, bindable, bindable_any
from tinynn_gpu.runtime.kernels import groups


def check_dtypes(name, *arrays):
    """The (float, index) kernels' operands: float32 values, then one int32 index array."""
    *values, index = arrays
    if any(a.dtype != np.float32 for a in values) or index.dtype.kind != "i":
        raise OnCpu(f"{name} of {', '.join(str(a.dtype) for a in arrays)}")


def cross_entropy_forward(self, logits, targets, ignore_index, for_backward=True):
    n, c = logits.shape
    check_dtypes("cross_entropy_forward", logits, targets)
    operands = bindable(logits), bindable_any(targets)
    rows, loss = self._empty((n, 2)), self._empty(())
    probs, count = self._for_backward((n, c), for_backward), self._for_backward((), for_backward, 1)
    rt = self.rt
    key = ("cross_entropy_forward", *group_sum.variant(rt), n, c, int(ignore_index))
    launches = rt.launches.get(key) or rt.keep(key, _forward_launches(rt, n, c, ignore_index))
    rt.launch(launches[0], (*operands, probs, rows, rt.error_flags))
    rt.launch(launches[1], (rows, loss, count))
    return (loss, probs, count) if for_backward else (loss, None, None)


def _forward_launches(rt, n, c, ignore_index) -> tuple:
    """The rows' dispatch, then the mean's."""
    shader = group_sum.shader(rt, "cross_entropy")
    params = {"n": n, "cols": c, "ignore_index": int(ignore_index)}
    return (rt.prepare(shader, "cross_entropy_forward_rows_main", -(-n // group_sum.TEAM_ROWS),
                       ("logits", "targets", "probs", "rows", "errors"), params),
            rt.prepare(shader, "cross_entropy_forward_mean_main", 1, ("rows", "result", "count"), params))


def cross_entropy_backward(self, probs, targets, g_loss, ignore_index, count=None):
    check_dtypes("cross_entropy_backward", probs, g_loss, *([] if count is None else [count]), targets)
    n, c = probs.shape
    grad = self._empty((n, c))
    shader = group_sum.shader(self.rt, "cross_entropy")
    params = {"n": n, "cols": c, "ignore_index": int(ignore_index)}
    if count is None:
        count = self._empty(())
        self.rt.dispatch(shader, "cross_entropy_count_main", 1, {"targets": bindable_any(targets), "count": count},
                         params)
    self.rt.dispatch(shader, "cross_entropy_backward_main", groups(n * c),
                     {"targets": bindable_any(targets), "probs": bindable(probs), "count": bindable(count),
                      "g_loss": bindable(g_loss), "grad": grad, "errors": self.rt.error_flags}, params)
    return grad
