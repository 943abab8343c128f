"""LayerNorm over the last axis (layernorm.wgsl, compiled through group_sum.py with the device's row teams and
the rows' Value width): the forward a row team per row, the backward the rows' gradients and the weight and bias
gradients' column sums in one dispatch, with a finish only where the rows are cut into splits. Methods of the
backend (backend.py's table)."""
from __future__ import annotations

import math

from tinynn_gpu.ops import group_sum
from tinynn_gpu.runtime.arrays import bindable
from tinynn_gpu.runtime.kernels import groups

# rows one backward column workgroup sums: a training shape of 2048 rows takes one split and so no finish pass;
# more rows are cut into splits that a finish adds, so each workgroup's work stays short
SPLIT_ROWS = 2048
# columns per backward column workgroup (a power of two), by the Value width (1: rows of floats, C not a multiple
# of 4; 4: vec4s) and the rows' width C (the entry of the widest C reached): a workgroup's row of 8 floats is one
# 32-byte sector (BENCHMARKS.md, "Kernel tuning notes", has the sweep)
GROUP_COLS = {1: {0: 4, 512: 8}, 4: {0: 4, 512: 16}}


def layernorm_forward(self, x, weight, bias, eps, for_backward=True):
    c, lead = x.shape[-1], x.shape[:-1]
    rows = math.prod(lead)
    w = weight if weight is not None else self._constant(1.0, c)
    b = bias if bias is not None else self._constant(0.0, c)
    operands = bindable(x), bindable(w), bindable(b)
    y, rt = self._empty(x.shape), self.rt
    if for_backward:  # (`_for_backward` written out: every LayerNorm of an eager forward passes here)
        mean, rstd = self._empty(lead), self._empty(lead)
    else:
        mean, rstd = rt.scratch(0, rows), rt.scratch(1, rows)
    key = ("layernorm_forward", *group_sum.variant(rt), rows, c, eps)
    launch = rt.launches.get(key)
    if launch is None:
        width, step = group_sum.row_values(c)
        launch = rt.keep(key, rt.prepare(
            group_sum.shader(rt, "layernorm", width, step), "layernorm_forward_main",
            -(-rows // group_sum.TEAM_ROWS), ("x", "weight", "bias", "out", "mean", "rstd"),
            {"rows": rows, "cols": c // width, "eps": eps}))
    rt.launch(launch, (*operands, y, mean, rstd))
    return (y, mean, rstd) if for_backward else (y, None, None)


def layernorm_backward(self, g, x, weight, mean, rstd, has_bias=True, g_add=None):
    c = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    w = weight if weight is not None else self._constant(1.0, c)
    gx = self._empty(x.shape)
    wanted = weight is not None or has_bias
    splits = -(-rows // SPLIT_ROWS) if wanted else 1
    gw, gb = (self._empty((c,)), self._empty((c,))) if wanted else (self.rt.stand_in(1), self.rt.stand_in(2))
    partials = self._empty((2 * splits * c,)) if splits > 1 else self.rt.stand_in(3)
    width, step = group_sum.row_values(c)  # the kernel's cols and group_cols count Values of `width` floats
    values = c // width
    # in Values: at most the 256 lanes of a workgroup, each column's lanes a power of two that the tree adds up
    by_c = GROUP_COLS[width]
    group_cols = min(256, max(1, by_c[max(at for at in by_c if at <= c)] // width))
    params = {"rows": rows, "cols": values, "has_g_add": int(g_add is not None),
              "param_groups": -(-values // group_cols) * splits if wanted else 0,
              "group_cols": group_cols, "split_rows": SPLIT_ROWS, "splits": splits}
    shader = group_sum.shader(self.rt, "layernorm", width, step)
    added = self.rt.stand_in(0) if g_add is None else bindable(g_add)
    self.rt.dispatch(shader, "layernorm_backward_main", params["param_groups"] + -(-rows // group_sum.TEAM_ROWS),
                     {"x": bindable(x), "weight": bindable(w), "mean": bindable(mean), "rstd": bindable(rstd),
                      "g": bindable(g), "g_add": added, "out": gx, "partials": partials, "g_weight": gw,
                      "g_bias": gb}, params)
    if splits > 1:
        self.rt.dispatch(shader, "layernorm_param_grads_finish_main", groups(values),
                         {"partials": partials, "g_weight": gw, "g_bias": gb}, params)
    return gx, (gw if weight is not None else None), (gb if has_bias else None)
