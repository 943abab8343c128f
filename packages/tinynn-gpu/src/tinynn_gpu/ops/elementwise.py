"""Elementwise ops (elementwise.wgsl): fills, unary and binary ops with NumPy's broadcasting, scalars, the causal
fill and dropout's mask; int32 kernels for the ops that keep integers integers. Each function is a method of the
backend (backend.py's table), named as the NumPy reference names it."""
from __future__ import annotations

import numbers

import numpy as np

from tinynn_gpu.ops.strided import contiguous_strides, merge_dims
from tinynn_gpu.runtime.arrays import OnCpu, bindable, bindable_any
from tinynn_gpu.runtime.kernels import groups

UNARY = {"neg": 0, "exp": 1, "log": 2, "tanh": 3, "relu": 4, "gelu": 5}
BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3, "eq": 4}
SCALAR = {"add": 0, "mul": 1, "pow": 2}
INT_UNARY, INT_BINARY, INT_SCALAR = {"neg", "relu"}, {"add", "sub", "mul", "eq"}, {"add", "mul"}  # int32 kernels


def code(table: dict, family: str, op: str) -> int:
    """An op's kernel code; an unknown op is refused here, before anything is dispatched."""
    found = table.get(op)
    if found is None:
        raise ValueError(f"unknown {family} op {op!r}")
    return found


def fill(self, out, value: float):
    self.rt.dispatch("elementwise", "fill_main", groups(out.size), {"out": bindable(out)},
                     {"n": out.size, "value": float(value)})
    return out


def constant(self, value: float, n: int = 1):
    """A cached array of n copies of value (stand-in for a missing LayerNorm weight or clip scale)."""
    key = (value, n)
    if key not in self._constants:
        self._constants[key] = self._fill(self._empty((n,)), value)
    return self._constants[key]


def full(self, shape, value, dtype=np.float32):
    if np.dtype(dtype).kind in "iub":  # the fill kernel writes f32 bits: ints go through the host
        return self.from_numpy(np.full(shape, value, dtype=dtype))
    return self._fill(self._empty(shape), value)


def unary(self, op, a):
    op_code = code(UNARY, "unary", op)
    if a.dtype.kind == "i":
        if op not in INT_UNARY:
            raise OnCpu(f"{op} of int32")
        out = self._empty(a.shape, a.dtype)
        self.rt.dispatch("elementwise", "unary_int_main", groups(a.size), {"a_int": bindable_any(a), "out_int": out},
                         {"n": a.size, "op": op_code})
        return out
    out = self._empty(a.shape)
    self.rt.dispatch("elementwise", "unary_main", groups(a.size), {"a": bindable(a), "out": out},
                     {"n": a.size, "op": op_code})
    return out


def unary_backward(self, op, x, y, g):
    out = self._empty(g.shape)
    self.rt.dispatch("elementwise", "unary_backward_main", groups(g.size),
                     {"a": bindable(x), "b": bindable(y), "c": bindable(g), "out": out},
                     {"n": g.size, "op": code(UNARY, "unary", op)})
    return out


def binary(self, op, a, b):
    op_code = code(BINARY, "binary", op)
    is_int = a.dtype.kind == "i"
    if a.dtype != b.dtype or (is_int and op not in INT_BINARY):
        raise OnCpu(f"{op} of {a.dtype} and {b.dtype}")
    shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    out = self._empty(shape, a.dtype)

    def strides_in(x):
        lead, own = len(shape) - x.ndim, contiguous_strides(x.shape)
        return [0 if i < lead or x.shape[i - lead] == 1 else own[i - lead] for i in range(len(shape))]
    merged, (sa, sb) = merge_dims(shape, strides_in(a), strides_in(b))
    params = {"n": out.size, "op": op_code, "ndim": len(merged), "shape": merged, "a_strides": sa, "b_strides": sb}
    if is_int:
        self.rt.dispatch("elementwise", "binary_int_main", groups(out.size),
                         {"a_int": bindable_any(a), "b_int": bindable_any(b), "out_int": out}, params)
    else:
        self.rt.dispatch("elementwise", "binary_main", groups(out.size),
                         {"a": bindable(a), "b": bindable(b), "out": out}, params)
    return out


def scalar(self, op, a, s):
    op_code = code(SCALAR, "scalar", op)
    if a.dtype.kind == "i":
        if op not in INT_SCALAR or not isinstance(s, numbers.Integral) or not -2**31 <= s < 2**31:
            raise OnCpu(f"int32 {op} {s!r}")  # NumPy's answer is float, or an int64
        out = self._empty(a.shape, a.dtype)
        self.rt.dispatch("elementwise", "scalar_int_main", groups(a.size), {"a_int": bindable_any(a), "out_int": out},
                         {"n": a.size, "op": op_code, "int_value": int(s)})
        return out
    out = self._empty(a.shape)
    self.rt.dispatch("elementwise", "scalar_main", groups(a.size), {"a": bindable(a), "out": out},
                     {"n": a.size, "op": op_code, "value": float(s)})
    return out


def causal_fill(self, x, value):
    out = self._empty(x.shape)
    self.rt.dispatch("elementwise", "causal_fill_main", groups(x.size), {"a": bindable(x), "out": out},
                     {"n": x.size, "t_q": x.shape[-2], "t_k": x.shape[-1], "value": float(value)})
    return out


def dropout_mask(self, shape, p, seed, dtype=np.float32):
    self.rt.not_capturable("dropout draws a new mask every step")
    out = self._empty(shape)
    threshold = min(int(p * 2**32), 2**32 - 1)
    self.rt.dispatch("elementwise", "dropout_mask_main", groups(out.size), {"out": out},
                     {"n": out.size, "seed": seed & 0xFFFFFFFF, "threshold": threshold, "value": 1.0 / (1.0 - p)})
    return out
