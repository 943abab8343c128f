"""The wgpu backend: core's backend interface, every op a WGSL kernel on arrays that stay on the GPU.

Ops only record dispatches (runtime.py); nothing waits for the GPU until a value is read back. Names match
the NumPy reference (tinynn/numpy_backend.py), which every kernel is tested against. An array too large for
one storage binding lives on the host instead, and the ops that touch it run through the NumPy fallback
(fallback.py wraps every op with it). The training step's optimizer, norm and data-parallel ops are in
step_ops.py, generation's in decode.py: bases of `WgpuBackend`.

Dtypes: arrays are float32 or int32. Int32 arrays have kernels for the layout ops, add, sub, mul, eq, neg,
relu, and add or mul by an integer, with int32's wrap-around; every other op given an int32 operand (exp,
div, a float scalar, sum and max, mixed dtypes) runs on the NumPy reference, counted in `fallbacks`, and
gives NumPy's answer stored as float32 or int32. Either way, nothing is computed on misread bits.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from tinynn.backends import Backend, BackendUnavailable
from tinynn_gpu import fallback, group_sum
from tinynn_gpu.attention import Attention, unsupported
from tinynn_gpu.capture import CapturedStep
from tinynn_gpu.decode import DecodeOps
from tinynn_gpu.layout import basic_view, contiguous_strides, is_basic, merge_dims
from tinynn_gpu.matmul import MatmulSelector
from tinynn_gpu.matmul_blocked import ACTIVATIONS, Epilogue
from tinynn_gpu.multi_tensor import MultiTensor
from tinynn_gpu.packing import Packing
from tinynn_gpu.pool import FLOAT32, bindable, bindable_any
from tinynn_gpu.runtime import GpuArray, OnCpu, Runtime, TooLarge, _trim, groups
from tinynn_gpu.step_ops import StepOps

UNARY = {"neg": 0, "exp": 1, "log": 2, "tanh": 3, "relu": 4, "gelu": 5}
BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3, "eq": 4}
SCALAR = {"add": 0, "mul": 1, "pow": 2}
INT_UNARY, INT_BINARY, INT_SCALAR = {"neg", "relu"}, {"add", "sub", "mul", "eq"}, {"add", "mul"}  # int32 kernels
# rows one LayerNorm-backward column workgroup sums: every training shape we bench (2048 rows) takes one split
# and so no finish pass; more rows are cut into splits that a finish adds, so each workgroup's work stays short
LAYERNORM_SPLIT_ROWS = 2048
# columns per LayerNorm-backward column workgroup (a power of two), by layernorm.wgsl's Value width (1: rows of floats,
# C not a multiple of 4; 4: vec4s) and the rows' width C (the entry of the widest C reached): C / columns workgroups
# share the rows. H200 (experiments/row_kernels.py --group-cols, us a backward): with the kernel before Values, a
# float a load, 2048 x 256, 4 columns 8.2, 2 8.9, 8 9.4 (session 10); 2048 x 768 (big), 8 columns 11.3 and 11.7, 4
# 13.9 and 14.1, 2 18.0 (session 17, two calls): a workgroup's row of 8 columns is one 32-byte sector. Session 21,
# Values: vec4s at 2048 x 768, 16 columns 9.62, 9.67, 8 10.29, 10.30 (and with a draft: 4 12.3 and 13.6); at 2048 x
# 256, 4 and 8 columns 6.9-7.0, 16 7.6-7.8; floats at 2048 x 768 (`--row-values 1x8`), 8 columns 10.71, 11.03, 16
# 11.90, 11.98
LAYERNORM_GROUP_COLS = {1: {0: 4, 512: 8}, 4: {0: 4, 512: 16}}
NO_EPILOGUE = Epilogue()  # frozen: one for every plain matmul


class WgpuBackend(StepOps, DecodeOps, Backend):
    name = "gpu"
    interface_version = 4  # tinynn.backends.INTERFACE_VERSION when these ops were written
    is_gpu = True

    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx
        self.rt = Runtime(ctx)
        self.device_name = ctx.name
        self.is_software = ctx.is_software
        self.mm = MatmulSelector(self.rt)
        self.multi = MultiTensor(self.rt)
        self.attention = Attention(self.rt)
        self.packing = Packing(self.rt)
        self._constants = {}
        self._empty = self.rt.empty  # an uninitialised array (shape, dtype=float32): ~2 per eager dispatch
        self.matmul_plans = {}  # `_matmul`'s plans by (shapes, layout, epilogue parts, forced variant)
        for name in group_sum.TEMPLATES:  # compiled now: a failure is a reason at start-up, not a failed step
            try:
                group_sum.shader(self.rt, name)
            except Exception as e:
                raise BackendUnavailable(f"kernel {name}.wgsl failed to compile on {ctx.name}: {e}") from None

    @property
    def counters(self):
        return self.rt.counters

    def describe(self) -> dict:
        return {**super().describe(), **self.ctx.describe(), **self.rt.describe(), "matmul": self.mm.describe()}

    def memory_stats(self, reset_peak=False):
        return self.rt.memory_stats(reset_peak)

    def empty_cache(self):
        self.rt.empty_cache()

    def profile(self, fn) -> list[dict]:
        """GPU time per kernel while fn() runs (needs the timestamp-query feature)."""
        return self.rt.profile(fn)

    # --- transfer and creation ---
    def from_numpy(self, x):
        x = np.asarray(x)
        if x.dtype.kind == "f":
            x = x.astype(np.float32, copy=False)
        elif x.dtype.kind in "iub":
            if x.size and (x.max() > 2**31 - 1 or x.min() < -2**31):
                raise ValueError("integer values do not fit the GPU's int32")
            x = x.astype(np.int32, copy=False)
        else:
            raise TypeError(f"the GPU backend stores float32 and int32, not {x.dtype}")
        try:
            return self.rt.upload(x)
        except TooLarge:
            return GpuArray(None, x.shape, x.dtype, host=np.array(x))  # too large to bind: ops fall back

    def to_numpy(self, a, out=None):
        if a.buffer is not None:
            return self.rt.read(a, out)
        if out is None:
            return np.array(a.host)
        out[...] = a.host
        return out

    def is_array(self, a):
        return isinstance(a, GpuArray)

    def sync(self):
        self.rt.sync()

    def _fill(self, out, value: float):
        self.rt.dispatch("elementwise", "fill_main", groups(out.size), {2: bindable(out)},
                         {"n": out.size, "value": float(value)})
        return out

    def _constant(self, value: float, n: int = 1):
        """A cached array of n copies of value (stand-in for a missing LayerNorm weight or clip scale)."""
        key = (value, n)
        if key not in self._constants:
            self._constants[key] = self._fill(self._empty((n,)), value)
        return self._constants[key]

    def _for_backward(self, shape: tuple, for_backward: bool, slot: int = 0):
        """An output of a forward that only its backward reads: an array of its own, or, where no backward will
        run (`for_backward` False), the runtime's scratch array `slot`, which the kernel writes and nothing
        reads (an op's outputs take different slots)."""
        return self._empty(shape) if for_backward else self.rt.scratch(slot, math.prod(shape))

    def full(self, shape, value, dtype=np.float32):
        if np.dtype(dtype).kind in "iub":  # the fill kernel writes f32 bits: ints go through the host
            return self.from_numpy(np.full(shape, value, dtype=np.int32))
        return self._fill(self._empty(shape), value)

    def write_(self, dst, src):
        if dst.buffer is None:
            dst.host[...] = src
        else:
            self.rt.write(dst, np.asarray(src))

    def capture(self, fn, key=None, copy_result=True):
        return CapturedStep(self, fn, key, copy_result)

    # --- layout ---
    def reshape(self, a, shape):
        return a.view(shape)

    def _gather(self, a, offset, shape, strides):
        out = self._empty(shape, a.dtype)
        merged, (view_strides,) = merge_dims(shape, strides)
        self.rt.dispatch("strided", "gather_main", groups(out.size), {0: bindable_any(a), 2: out},
                         {"n": out.size, "ndim": len(merged), "offset": offset, "shape": merged,
                          "strides": view_strides})
        return out

    def _scatter(self, src, dst, offset, shape, strides):
        merged, (view_strides,) = merge_dims(shape, strides)
        self.rt.dispatch("strided", "scatter_main", groups(src.size), {0: bindable_any(src), 2: bindable_any(dst)},
                         {"n": src.size, "ndim": len(merged), "offset": offset, "shape": merged,
                          "strides": view_strides})

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

    # --- elementwise ---
    def unary(self, op, a):
        code = _code(UNARY, "unary", op)
        if a.dtype.kind == "i":
            if op not in INT_UNARY:
                raise OnCpu(f"{op} of int32")
            out = self._empty(a.shape, a.dtype)
            self.rt.dispatch("elementwise", "unary_int_main", groups(a.size), {5: bindable_any(a), 7: out},
                             {"n": a.size, "op": code})
            return out
        out = self._empty(a.shape)
        self.rt.dispatch("elementwise", "unary_main", groups(a.size), {0: bindable(a), 2: out},
                         {"n": a.size, "op": code})
        return out

    def unary_backward(self, op, x, y, g):
        out = self._empty(g.shape)
        self.rt.dispatch("elementwise", "unary_backward_main", groups(g.size),
                         {0: bindable(x), 1: bindable(y), 4: bindable(g), 2: out},
                         {"n": g.size, "op": _code(UNARY, "unary", op)})
        return out

    def binary(self, op, a, b):
        code = _code(BINARY, "binary", op)
        is_int = a.dtype.kind == "i"
        if a.dtype != b.dtype or (is_int and op not in INT_BINARY):
            raise OnCpu(f"{op} of {a.dtype} and {b.dtype}")
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
        out = self._empty(shape, a.dtype)

        def strides_in(x):
            lead, own = len(shape) - x.ndim, contiguous_strides(x.shape)
            return [0 if i < lead or x.shape[i - lead] == 1 else own[i - lead] for i in range(len(shape))]
        merged, (sa, sb) = merge_dims(shape, strides_in(a), strides_in(b))
        params = {"n": out.size, "op": code, "ndim": len(merged), "shape": merged, "a_strides": sa, "b_strides": sb}
        if is_int:
            self.rt.dispatch("elementwise", "binary_int_main", groups(out.size),
                             {5: bindable_any(a), 6: bindable_any(b), 7: out}, params)
        else:
            self.rt.dispatch("elementwise", "binary_main", groups(out.size),
                             {0: bindable(a), 1: bindable(b), 2: out}, params)
        return out

    def scalar(self, op, a, s):
        code = _code(SCALAR, "scalar", op)
        if a.dtype.kind == "i":
            if op not in INT_SCALAR or not isinstance(s, numbers.Integral) or not -2**31 <= s < 2**31:
                raise OnCpu(f"int32 {op} {s!r}")  # NumPy's answer is float, or an int64
            out = self._empty(a.shape, a.dtype)
            self.rt.dispatch("elementwise", "scalar_int_main", groups(a.size), {5: bindable_any(a), 7: out},
                             {"n": a.size, "op": code, "int_value": int(s)})
            return out
        out = self._empty(a.shape)
        self.rt.dispatch("elementwise", "scalar_main", groups(a.size), {0: bindable(a), 2: out},
                         {"n": a.size, "op": code, "value": float(s)})
        return out

    def causal_fill(self, x, value):
        out = self._empty(x.shape)
        self.rt.dispatch("elementwise", "causal_fill_main", groups(x.size), {0: bindable(x), 2: out},
                         {"n": x.size, "t_q": x.shape[-2], "t_k": x.shape[-1], "value": float(value)})
        return out

    def dropout_mask(self, shape, p, seed, dtype=np.float32):
        if self.rt.tape is not None:
            self.rt.tape.broken = "dropout draws a new mask every step"
        out = self._empty(shape)
        threshold = min(int(p * 2**32), 2**32 - 1)
        self.rt.dispatch("elementwise", "dropout_mask_main", groups(out.size), {2: out},
                         {"n": out.size, "seed": seed & 0xFFFFFFFF, "threshold": threshold, "value": 1.0 / (1.0 - p)})
        return out

    # --- reductions and matmul ---
    def _reduce(self, a, axes, keepdims, op):
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
            outer, r, inner = (math.prod(shape[:start]), math.prod(shape[start:stop + 1]),
                               math.prod(shape[stop + 1:]))
            x = self._reduce_middle(x, outer, r, inner, op)
            shape = shape[:start] + shape[stop + 1:]
        if not runs:
            x = self._gather(a, 0, a.shape, contiguous_strides(a.shape))  # a copy, never an alias
        return x.view(kept if keepdims else tuple(shape))

    def _reduce_middle(self, a, outer, r, inner, op):
        """(outer, R, inner) -> (outer * inner,): one dispatch whatever the sizes (reduce.wgsl)."""
        out = self._empty((outer * inner,))
        shader = group_sum.shader(self.rt, "reduce")
        params = {"outer": outer, "r": r, "inner": inner, "op": op}
        if inner == 1:
            self.rt.dispatch(shader, "reduce_rows_main", outer, {0: bindable(a), 2: out}, params)
        else:
            self.rt.dispatch(shader, "reduce_columns_main", outer * -(-inner // 32), {0: bindable(a), 2: out}, params)
        return out

    def sum(self, a, axes, keepdims=False):
        return self._reduce(a, axes, keepdims, 0)

    def max(self, a, axes, keepdims=False):
        return self._reduce(a, axes, keepdims, 1)

    def matmul(self, a, b, transpose_a=False, transpose_b=False):
        return self._matmul(a, b, transpose_a, transpose_b, NO_EPILOGUE)

    def linear_forward(self, x, weight, bias=None, residual=None, activation=None, for_backward=True):
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}")
        pre = self._for_backward(x.shape[:-1] + weight.shape[:1], for_backward) if activation else None
        y = self._matmul(x, weight, False, True, Epilogue(None if bias is None else bindable(bias), activation, pre,
                                                          None if residual is None else bindable(residual)))
        return y, (pre if for_backward else None)

    def linear_backward(self, g, x, weight, pre=None, activation=None, has_bias=True, x_activation=None, x_pre=None):
        if x_activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {x_activation!r}")
        if activation is not None:
            g = self.unary_backward(activation, pre, pre, g)
        g_bias = self._empty((weight.shape[0],)) if has_bias else None
        x_epilogue, weight_epilogue = Epilogue(activation_grad=x_activation, pre=x_pre), Epilogue(row_sums=g_bias)
        paired = self._linear_gradients_paired(g, x, weight, x_epilogue, weight_epilogue)
        if paired is not None:
            return (*paired, g_bias)
        g_x = self._matmul(g, weight, False, False, x_epilogue)
        g_weight = self._matmul(g, x, True, False, weight_epilogue)  # g.T @ x; g_bias = g's column sums
        return g_x, g_weight, g_bias

    def _linear_gradients_paired(self, g, x, weight, x_epilogue, weight_epilogue):
        """(g @ weight, g.T @ x) with their epilogues in one dispatch, where the matmul selector chose that for
        these shapes (`MatmulSelector.plan_pair`); else None. Planned once per key, like `_matmul`."""
        key = ("pair", g.shape, x.shape, weight.shape, x_epilogue.activation_grad, weight_epilogue.row_sums is None,
               self.mm.forced)
        record = self.matmul_plans.get(key, False)
        if record is False:
            record = None
            if g.ndim == x.ndim == 2 and 0 not in g.shape + x.shape:
                (rows, outs), ins = g.shape, x.shape[1]
                g_, x_, weight_ = bindable(g), bindable(x), bindable(weight)
                record = self.mm.plan_pair(
                    (g_, weight_, self._empty((rows, ins)), 1, rows, ins, outs, False, False, False, x_epilogue),
                    (g_, x_, self._empty((outs, ins)), 1, outs, ins, rows, True, False, False, weight_epilogue))
            self.matmul_plans[key] = record
            _trim(self.matmul_plans)
        if record is None:
            return None
        g, x, weight = bindable(g), bindable(x), bindable(weight)
        g_x, g_weight = self._empty((g.shape[0], x.shape[1])), self._empty(weight.shape)
        record(g, weight, g_x, x_epilogue, g, x, g_weight, weight_epilogue)
        return g_x, g_weight

    def _matmul(self, a, b, transpose_a, transpose_b, epilogue):
        """out = epilogue(op(a) @ op(b)): in the matmul's own stores where its kernel can, else after it. Each
        (shapes, layout, epilogue parts, forced variant) is planned once (`_plan_matmul`): an eager forward repeats
        a few."""
        key = (a.shape, b.shape, transpose_a, transpose_b, epilogue.bias is None, epilogue.activation,
               epilogue.residual is None, epilogue.row_sums is None, epilogue.activation_grad, self.mm.forced)
        plan = self.matmul_plans.get(key)
        if plan is None:
            plan = self.matmul_plans[key] = self._plan_matmul(a, b, transpose_a, transpose_b, epilogue)
            _trim(self.matmul_plans)
        out_shape, record, description = plan
        if record is None:  # operands to broadcast, or an empty output: the general path
            return self._matmul_unplanned(a, b, transpose_a, transpose_b, epilogue, out_shape)
        if a.buffer is None or b.buffer is None or a.dtype is not FLOAT32 or b.dtype is not FLOAT32:
            bindable(a), bindable(b)  # the refusal (`bindable`'s test written out: most eager dispatches pass here)
        out = self._empty(out_shape)
        self.mm.last = description
        if record(a, b, out, epilogue):
            return out
        return self._epilogue_after(a, out, transpose_a, epilogue)

    def _plan_matmul(self, a, b, transpose_a, transpose_b, epilogue) -> tuple:
        """(output shape, record(a, b, out, epilogue) -> applied?, the kernel's description) for `_matmul`, which
        keeps it per key; record and description None where the batch axes broadcast or the output is empty.
        Choosing the kernel may tune it on the real operands (`MatmulSelector.plan`), into an output made here."""
        if b.ndim == 2 and a.ndim != 2 and not transpose_a:  # one weight for every row: a's leading axes fold into M
            rows = a.view((math.prod(a.shape[:-1]), a.shape[-1]))  # (N, k): a linear layer's x (..., in)
            # planned on the rows view; its record reads a's buffer, which the view shares
            out_shape, record, description = self._plan_matmul(rows, b, False, transpose_b, epilogue)
            return a.shape[:-1] + out_shape[-1:], record, description
        m, n, k, shared_b, batch_shape = _matmul_dims(a, b, transpose_a, transpose_b)
        out_shape = batch_shape + (m, n)
        if (not shared_b and a.shape[:-2] != b.shape[:-2]) or 0 in out_shape:
            return out_shape, None, None
        record, description = self.mm.plan(bindable(a), bindable(b), self._empty(out_shape), math.prod(batch_shape), m,
                                           n, k, transpose_a, transpose_b, shared_b, epilogue)
        return out_shape, record, description

    def _matmul_unplanned(self, a, b, transpose_a, transpose_b, epilogue, out_shape):
        """`_matmul` where the batch axes broadcast (each operand gathered to the common shape, then planned), or
        into an empty output (of `out_shape`)."""
        if 0 in out_shape:
            bindable(a), bindable(b)  # refused as `_matmul` refuses them: NumPy's empty int32 product is int32
            if epilogue.row_sums is not None:
                self._fill(epilogue.row_sums, 0.0)
            return self._empty(out_shape)
        batch_shape = out_shape[:-2]
        return self._matmul(self.broadcast_to(a, batch_shape + a.shape[-2:]),
                            self.broadcast_to(b, batch_shape + b.shape[-2:]), transpose_a, transpose_b, epilogue)

    def _epilogue_after(self, a, out, transpose_a, epilogue):
        """The epilogue as separate ops, after a kernel without one (the lesson's)."""
        if epilogue.activation_grad is not None:
            out = self.unary_backward(epilogue.activation_grad, epilogue.pre, epilogue.pre, out)
        if epilogue.row_sums is not None:
            sums = self.sum(a, (a.ndim - 2 if transpose_a else a.ndim - 1,))
            self._copy(sums, epilogue.row_sums)
        if epilogue.bias is not None:
            out = self.binary("add", out, epilogue.bias)
        if epilogue.activation is not None:
            self._copy(out, epilogue.pre)
            out = self.unary(epilogue.activation, out)
        if epilogue.residual is not None:
            out = self.binary("add", out, epilogue.residual)
        return out

    def _copy(self, src, dst):
        self._scatter(src, dst, 0, src.shape, contiguous_strides(src.shape))

    # --- fused neural-network ops (one workgroup per row) ---
    def softmax_forward(self, x, causal=False, scale=1.0):
        out, rows = self._empty(x.shape), math.prod(x.shape[:-1])
        t_q = x.shape[-2] if causal else 1
        self.rt.dispatch("softmax", "softmax_forward_main", rows, {0: bindable(x), 2: out},
                         {"rows": rows, "len": x.shape[-1], "causal": int(causal), "t_q": t_q, "scale": float(scale)})
        return out

    def softmax_backward(self, y, g, scale=1.0):
        out, rows = self._empty(y.shape), math.prod(y.shape[:-1])
        self.rt.dispatch("softmax", "softmax_backward_main", rows, {0: bindable(y), 1: bindable(g), 2: out},
                         {"rows": rows, "len": y.shape[-1], "scale": float(scale)})
        return out

    def log_softmax_forward(self, x):
        out, rows = self._empty(x.shape), math.prod(x.shape[:-1])
        self.rt.dispatch("softmax", "log_softmax_forward_main", rows, {0: bindable(x), 2: out},
                         {"rows": rows, "len": x.shape[-1]})
        return out

    def log_softmax_backward(self, y, g):
        out, rows = self._empty(y.shape), math.prod(y.shape[:-1])
        self.rt.dispatch("softmax", "log_softmax_backward_main", rows, {0: bindable(y), 1: bindable(g), 2: out},
                         {"rows": rows, "len": y.shape[-1]})
        return out

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
                -(-rows // group_sum.TEAM_ROWS), (0, 1, 2, 4, 5, 6), {"rows": rows, "cols": c // width, "eps": eps}))
        rt.launch(launch, (*operands, y, mean, rstd))
        return (y, mean, rstd) if for_backward else (y, None, None)

    def layernorm_backward(self, g, x, weight, mean, rstd, has_bias=True, g_add=None):
        c = x.shape[-1]
        rows = math.prod(x.shape[:-1])
        w = weight if weight is not None else self._constant(1.0, c)
        gx = self._empty(x.shape)
        wanted = weight is not None or has_bias
        splits = -(-rows // LAYERNORM_SPLIT_ROWS) if wanted else 1
        gw, gb = (self._empty((c,)), self._empty((c,))) if wanted else (self.rt.stand_in(1), self.rt.stand_in(2))
        partials = self._empty((2 * splits * c,)) if splits > 1 else self.rt.stand_in(3)
        width, step = group_sum.row_values(c)  # the kernel's cols and group_cols count Values of `width` floats
        values = c // width
        # in Values: at most the 256 lanes of a workgroup, each column's lanes a power of two that the tree adds up
        by_c = LAYERNORM_GROUP_COLS[width]
        group_cols = min(256, max(1, by_c[max(at for at in by_c if at <= c)] // width))
        params = {"rows": rows, "cols": values, "has_g_add": int(g_add is not None),
                  "param_groups": -(-values // group_cols) * splits if wanted else 0,
                  "group_cols": group_cols, "split_rows": LAYERNORM_SPLIT_ROWS, "splits": splits}
        shader = group_sum.shader(self.rt, "layernorm", width, step)
        added = self.rt.stand_in(0) if g_add is None else bindable(g_add)
        self.rt.dispatch(shader, "layernorm_backward_main", params["param_groups"] + -(-rows // group_sum.TEAM_ROWS),
                         {0: bindable(x), 1: bindable(w), 5: bindable(mean), 6: bindable(rstd), 7: bindable(g),
                          8: added, 4: gx, 9: partials, 10: gw, 11: gb}, params)
        if splits > 1:
            self.rt.dispatch(shader, "layernorm_param_grads_finish_main", groups(values), {9: partials, 10: gw, 11: gb},
                             params)
        return gx, (gw if weight is not None else None), (gb if has_bias else None)

    def cross_entropy_forward(self, logits, targets, ignore_index, for_backward=True):
        n, c = logits.shape
        _check_dtypes("cross_entropy_forward", logits, targets)
        operands = bindable(logits), bindable_any(targets)
        rows, loss = self._empty((n, 2)), self._empty(())
        probs, count = self._for_backward((n, c), for_backward), self._for_backward((), for_backward, 1)
        rt = self.rt
        key = ("cross_entropy_forward", *group_sum.variant(rt), n, c, int(ignore_index))
        launches = rt.launches.get(key) or rt.keep(key, self._cross_entropy_forward_launches(n, c, ignore_index))
        rt.launch(launches[0], (*operands, probs, rows, rt.error_flags))
        rt.launch(launches[1], (rows, loss, count))
        return (loss, probs, count) if for_backward else (loss, None, None)

    def _cross_entropy_forward_launches(self, n, c, ignore_index) -> tuple:
        """The rows' dispatch (logits 0, targets 1, probs 2, rows 4, flags 8), then the mean's (rows 4, loss 5,
        count 9)."""
        shader = group_sum.shader(self.rt, "cross_entropy")
        params = {"n": n, "cols": c, "ignore_index": int(ignore_index)}
        return (self.rt.prepare(shader, "cross_entropy_forward_rows_main", -(-n // group_sum.TEAM_ROWS),
                                (0, 1, 2, 4, 8), params),
                self.rt.prepare(shader, "cross_entropy_forward_mean_main", 1, (4, 5, 9), params))

    def cross_entropy_backward(self, probs, targets, g_loss, ignore_index, count=None):
        _check_dtypes("cross_entropy_backward", probs, g_loss, *([] if count is None else [count]), targets)
        n, c = probs.shape
        grad = self._empty((n, c))
        shader = group_sum.shader(self.rt, "cross_entropy")
        params = {"n": n, "cols": c, "ignore_index": int(ignore_index)}
        if count is None:
            count = self._empty(())
            self.rt.dispatch(shader, "cross_entropy_count_main", 1,
                             {1: bindable_any(targets), 9: count}, params)
        self.rt.dispatch(shader, "cross_entropy_backward_main", groups(n * c),
                         {1: bindable_any(targets), 2: bindable(probs), 9: bindable(count), 6: bindable(g_loss),
                          7: grad, 8: self.rt.error_flags}, params)
        return grad

    def embedding_forward(self, weight, idx):
        _check_dtypes("embedding_forward", weight, idx)
        v, c = weight.shape
        out = self._empty(idx.shape + (c,))
        self.rt.dispatch("embedding", "embedding_forward_main", groups(out.size),
                         {0: bindable(weight), 1: bindable_any(idx), 2: out, 8: self.rt.error_flags},
                         {"total": out.size, "cols": c, "rows": v})
        return out

    def embedding_backward(self, g, idx, num_embeddings):
        _check_dtypes("embedding_backward", g, idx)
        c, n = g.shape[-1], idx.size
        table = num_embeddings * c
        chunk = max(64, -(-n // max(1, 65536 // table)))  # ~64K threads, at least 64 positions each
        chunks = -(-n // chunk)
        partial = self._empty((chunks * table,))
        self.rt.dispatch("embedding", "embedding_backward_main", groups(partial.size),
                         {1: bindable_any(idx), 4: bindable(g), 2: partial, 8: self.rt.error_flags},
                         {"total": table, "cols": c, "rows": num_embeddings, "positions": n, "chunk": chunk,
                          "chunks": chunks})
        out = partial if chunks == 1 else self._reduce_middle(partial, 1, chunks, table, 0)
        return out.view((num_embeddings, c))

    def embedding_with_positions_forward(self, wte, wpe, idx):
        v, c = wte.shape
        _check_dtypes("embedding_with_positions_forward", wte, wpe, idx)
        operands = bindable(wte), bindable(wpe), bindable_any(idx)
        out, rt = self._empty(idx.shape + (c,)), self.rt
        total = out.size
        key = ("embedding_with_positions_forward", total, c, v, idx.shape[-1])
        launch = rt.launches.get(key) or rt.keep(key, rt.prepare(
            "embedding", "embedding_with_positions_forward_main", groups(total), (0, 5, 1, 2, 8),
            {"total": total, "cols": c, "rows": v, "positions": idx.shape[-1]}))
        rt.launch(launch, (*operands, out, rt.error_flags))
        return out

    def embedding_with_positions_backward(self, g, idx, num_embeddings, num_positions):
        _check_dtypes("embedding_with_positions_backward", g, idx)
        t, c = g.shape[-2:]
        g_wte, g_wpe = self._empty((num_embeddings, c)), self._empty((num_positions, c))
        # ~512 token workgroups, 32 columns or more each
        blocks = max(1, min(-(-c // 32), -(-512 // max(1, num_embeddings))))
        block_cols = 32 * -(-c // (32 * blocks))
        self.rt.dispatch("embedding", "embedding_with_positions_backward_main",
                         num_embeddings * blocks + -(-g_wpe.size // 256),
                         {1: bindable_any(idx), 4: bindable(g), 7: g_wte, 2: g_wpe, 8: self.rt.error_flags},
                         {"total": g_wpe.size, "cols": c, "rows": num_embeddings, "positions": t,
                          "batch": g.size // max(1, t * c), "blocks": blocks, "block_cols": block_cols})
        return g_wte, g_wpe

    def attention_forward(self, qkv, n_head, scale, for_backward=True):
        why = unsupported(qkv.shape, n_head)
        if why:
            raise OnCpu(why)
        batch, seq, c3 = qkv.shape
        operand = bindable(qkv)
        y = self._empty((batch, seq, c3 // 3))
        lse = self._empty((batch, n_head, seq)) if for_backward else self.rt.scratch(0, batch * n_head * seq)
        self.attention.forward(operand, y, lse, n_head, scale)
        return y, (lse if for_backward else None)

    def attention_backward(self, g, qkv, y, lse, n_head, scale):
        why = unsupported(qkv.shape, n_head)
        if why:
            raise OnCpu(why)
        g_qkv = self._empty(qkv.shape)
        self.attention.backward(bindable(g), bindable(qkv), bindable(y), bindable(lse), g_qkv, n_head, scale)
        return g_qkv


def _matmul_dims(a, b, transpose_a, transpose_b) -> tuple:
    """(m, n, k, shared_b, batch shape) of op(a) @ op(b): b shared by every batch where it is a 2-D weight under a
    batched a, else the batch axes broadcast (NumPy's rules)."""
    m, k = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
    n = b.shape[-2] if transpose_b else b.shape[-1]
    shared_b = b.ndim == 2 and a.ndim > 2
    batch_shape = a.shape[:-2] if shared_b else tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    return m, n, k, shared_b, batch_shape


def _code(table: dict, family: str, op: str) -> int:
    """An op's kernel code; an unknown op is refused here, before anything is dispatched."""
    code = table.get(op)
    if code is None:
        raise ValueError(f"unknown {family} op {op!r}")
    return code


def _check_dtypes(name, *arrays):
    """The (float, index) kernels' operands: float32 values, then one int32 index array."""
    *values, index = arrays
    if any(a.dtype != np.float32 for a in values) or index.dtype.kind != "i":
        raise OnCpu(f"{name} of {', '.join(str(a.dtype) for a in arrays)}")


fallback.install(WgpuBackend)
