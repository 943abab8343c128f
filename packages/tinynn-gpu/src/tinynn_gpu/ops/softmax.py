"""Softmax and log-softmax over the last axis, forward and backward (softmax.wgsl): a workgroup per row, with
the causal mask and a scale folded in, the two forms one kernel each way. Methods of the backend (backend.py's
table)."""
from __future__ import annotations

import math

from tinynn_gpu.runtime.arrays import bindable


def softmax_forward(self, x, causal=False, scale=1.0):
    return _forward(self, x, causal, scale, log=False)


def softmax_backward(self, y, g, scale=1.0):
    return _backward(self, y, g, scale, log=False)


def log_softmax_forward(self, x):
    return _forward(self, x, False, 1.0, log=True)


def log_softmax_backward(self, y, g):
    return _backward(self, y, g, 1.0, log=True)


def _forward(self, x, causal, scale, log):
    out, rows = self._empty(x.shape), math.prod(x.shape[:-1])
    t_q = x.shape[-2] if causal else 1
    self.rt.dispatch("softmax", "softmax_forward_main", rows, {"a": bindable(x), "out": out},
                     {"rows": rows, "len": x.shape[-1], "causal": int(causal), "t_q": t_q, "scale": float(scale),
                      "log": int(log)})
    return out


def _backward(self, y, g, scale, log):
    out, rows = self._empty(y.shape), math.prod(y.shape[:-1])
    self.rt.dispatch("softmax", "softmax_backward_main", rows, {"a": bindable(y), "b": bindable(g), "out": out},
                     {"rows": rows, "len": y.shape[-1], "scale": float(scale), "log": int(log)})
    return out
