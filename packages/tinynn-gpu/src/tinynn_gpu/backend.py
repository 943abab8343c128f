"""The wgpu backend: core's backend interface, every op a WGSL kernel on arrays that stay on the GPU.

`WgpuBackend` is a table: each op is the function of the same name in the wing that launches it (ops/ beside its
kernel file, matmul/linear.py), taken as a method. Ops only record dispatches (runtime/); nothing waits for the
GPU until a value is read back. Names match the NumPy reference (tinynn/numpy_backend.py), which every kernel is
tested against. An array too large for one storage binding lives on the host instead, and the ops that touch it
run through the NumPy fallback (fallback.py wraps every op with it).

Dtypes: GPU buffers hold float32 and int32. Other floats are stored as float32, and int64 (NumPy's default
int, every index array) as int32 where its values fit. Int32 arrays have kernels for the layout ops, add, sub,
mul, eq, neg, relu, and add or mul by an integer, with int32's wrap-around; every other op given an int32
operand (exp, div, a float scalar, sum and max, mixed dtypes) runs on the NumPy reference, counted in
`fallbacks`. Bools and the other integer types (uint8, int16, uint32, ...) have no kernel that keeps their
wrap-around, so they stay on the host like an array too large to bind, and every op on them is NumPy's. Either
way, nothing is computed on misread bits or in a dtype NumPy would not use.
"""
from __future__ import annotations

import math

import numpy as np

from tinynn import precision
from tinynn.backends import Backend, BackendUnavailable
from tinynn_gpu import fallback
from tinynn_gpu.matmul import linear
from tinynn_gpu.matmul.selection import MatmulSelector
from tinynn_gpu.ops import (attention, cross_entropy, decode, elementwise, embedding, group_sum, host_reduce, layernorm,
                            norm, optimizer, pack, reduce, softmax, strided)
from tinynn_gpu.ops.attention import Attention
from tinynn_gpu.ops.multi_tensor import MultiTensor
from tinynn_gpu.ops.pack import Packing
from tinynn_gpu.runtime.arrays import GpuArray, TooLarge
from tinynn_gpu.runtime.runtime import Runtime
from tinynn_gpu.runtime.capture import CapturedStep

HIGH = "f16 tensor cores summing in float32, each operand line scaled by a power of two: matmul/tensor.py"


class WgpuBackend(Backend):
    name = "gpu"
    interface_version = 5  # tinynn.backends.INTERFACE_VERSION when these ops were written
    is_gpu = True

    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx
        self.rt = Runtime(ctx)
        self.device_name = ctx.name
        self.is_software = ctx.is_software
        self.mm = MatmulSelector(self.rt)
        self.multi = MultiTensor(self.rt)
        self.attention = Attention(self.rt, self.mm)
        self.packing = Packing(self.rt)
        self._constants = {}
        self._empty = self.rt.pool.empty  # an uninitialised array (shape, dtype=float32): ~2 per eager dispatch
        self.matmul_plans = {}  # linear.py's plans by (shapes, layout, epilogue parts, forced variant)
        for name in group_sum.TEMPLATES:  # compiled now: a failure is a reason at start-up, not a failed step
            try:
                group_sum.shader(self.rt, name)
            except Exception as e:
                raise BackendUnavailable(f"kernel {name}.wgsl failed to compile on {ctx.name}: {e}") from None

    @property
    def counters(self):
        return self.rt.counters

    def describe(self) -> dict:
        return {**super().describe(), **self.ctx.describe(), **self.rt.describe(), "matmul": self.mm.describe(),
                "attention": self.attention.describe()}

    def matmul_precision(self):
        usable, why = self.mm.tensor_cores()
        if precision.current() == "high":
            return ("high", HIGH) if usable else ("highest", why)
        return "highest", "float32 products and sums; " + \
            ("'high' would use f16 tensor cores" if usable else f"'high' is not available: {why}")

    def memory_stats(self, reset_peak=False):
        return self.rt.memory_stats(reset_peak)

    def empty_cache(self):
        self.rt.empty_cache()

    def profile(self, fn) -> list[dict]:
        """GPU time per kernel while fn() runs (needs the timestamp-query feature)."""
        return self.rt.profile(fn)

    # --- transfer ---
    def from_numpy(self, x):
        x = np.asarray(x)
        kind = x.dtype.kind
        if kind == "f":
            x = x.astype(np.float32, copy=False)
        elif x.dtype == np.int64 or x.dtype == np.int32:  # NumPy's default int (index arrays): int32's kernels
            if x.dtype == np.int64 and x.size and (x.max() > 2**31 - 1 or x.min() < -2**31):
                raise ValueError("int64 values beyond int32's range on the GPU backend (it stores int32)")
            x = x.astype(np.int32, copy=False)
        elif kind in "iub":  # bool, uint8, ...: no kernel keeps their wrap-around, so NumPy computes them
            return GpuArray(None, x.shape, x.dtype, host=np.array(x))
        else:
            raise TypeError(f"the GPU backend stores float32, int32 and, on the host, other integers and bools; "
                            f"not {x.dtype}")
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

    def write_(self, dst, src):
        if dst.buffer is None:
            dst.host[...] = src
        else:
            self.rt.write(dst, np.asarray(src))

    def capture(self, fn, key=None, copy_result=True):
        self.mm.defer = True  # a training loop: tuning (matmuls', attention's) waits for the moments between steps
        return CapturedStep(self, fn, self._between_steps(key), copy_result)

    def transient(self):
        return self.mm.transient()

    def _between_steps(self, key):
        """The step's guard key, the matmul choices' generation and the matmul precision (every capture's, keyed or
        not: a generator's recorded steps too). CapturedStep asks for it at the start of every call, the moment
        between two steps: deferred tuning runs a bounded piece there, and once its tuned choices are in, the plans
        made before go and the step is recorded again with them (matmul/selection.py; attention asks for its
        choice at every call, ops/attention_choice.py)."""
        mm = self.mm

        def guard():
            if mm.pending and not self.rt.profiling and mm.tune_pending():  # (the profiler times one step)
                self.matmul_plans.clear()
            return None if key is None else key(), mm.generation, precision.current()
        return guard

    @property
    def tuning_pending(self) -> int:
        """Shapes (matmuls', "high" attention's) still to tune between steps: a benchmark times steps once this is
        0."""
        return len(self.mm.pending)

    def _for_backward(self, shape: tuple, for_backward: bool, slot: int = 0):
        """An output of a forward that only its backward reads: an array of its own, or, where no backward will
        run (`for_backward` False), the runtime's scratch array `slot`, which the kernel writes and nothing
        reads (an op's outputs take different slots)."""
        return self._empty(shape) if for_backward else self.rt.scratch(slot, math.prod(shape))

    # --- the table: each op where it launches its kernels ---
    full, _fill, _constant = elementwise.full, elementwise.fill, elementwise.constant
    unary, unary_backward, binary, scalar = elementwise.unary, elementwise.unary_backward, elementwise.binary, \
        elementwise.scalar
    causal_fill, dropout_mask = elementwise.causal_fill, elementwise.dropout_mask

    reshape, permute, broadcast_to = strided.reshape, strided.permute, strided.broadcast_to
    getitem, getitem_backward, concatenate = strided.getitem, strided.getitem_backward, strided.concatenate
    _gather, _scatter, _copy = strided.gather, strided.scatter, strided.copy

    sum, max = reduce.sum, reduce.max
    _reduce, _reduce_middle = reduce.reduce, reduce.reduce_middle

    matmul, linear_forward, linear_backward = linear.matmul, linear.linear_forward, linear.linear_backward
    _matmul, _plan_matmul, _matmul_unplanned = linear.matmul_epilogue, linear.plan_matmul, linear.matmul_unplanned
    _epilogue_after, _linear_gradients_paired = linear.epilogue_after, linear.linear_gradients_paired

    softmax_forward, softmax_backward = softmax.softmax_forward, softmax.softmax_backward
    log_softmax_forward, log_softmax_backward = softmax.log_softmax_forward, softmax.log_softmax_backward
    layernorm_forward, layernorm_backward = layernorm.layernorm_forward, layernorm.layernorm_backward
    cross_entropy_forward = cross_entropy.cross_entropy_forward
    cross_entropy_backward = cross_entropy.cross_entropy_backward
    classifier_forward = cross_entropy.classifier_forward
    embedding_forward, embedding_backward = embedding.embedding_forward, embedding.embedding_backward
    embedding_with_positions_forward = embedding.embedding_with_positions_forward
    embedding_with_positions_backward = embedding.embedding_with_positions_backward
    attention_forward, attention_backward = attention.attention_forward, attention.attention_backward

    global_norm, global_norm_and_clip, _norm = norm.global_norm, norm.global_norm_and_clip, norm.norm
    adamw_update_, sgd_update_ = optimizer.adamw_update_, optimizer.sgd_update_
    pack, unpack, reduce_on_host_ = pack.pack, pack.unpack, host_reduce.reduce_on_host_method

    embed_window, kv_cache_write_, attention_decode = decode.embed_window, decode.kv_cache_write_, \
        decode.attention_decode
    sample_tokens_, advance_ = decode.sample_tokens_, decode.advance_


fallback.install(WgpuBackend)
