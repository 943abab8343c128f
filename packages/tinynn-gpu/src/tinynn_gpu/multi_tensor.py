"""Multi-tensor optimizer kernels, generated from kernels/multi_tensor.wgsl for as many tensors per dispatch
as the device's storage-binding count allows (at most 64): AdamW and the gradient norm's sums of squares."""
from __future__ import annotations

import numpy as np

from tinynn_gpu.context import kernel_source

MAX_SLOTS = 64
WG = 256


def generate(slots: int) -> str:
    bindings, functions, adamw, squares = [], [], [], []
    for i in range(slots):
        b = 5 + 4 * i
        bindings += [f"@group(0) @binding({b}) var<storage, read_write> param_{i}: array<f32>;",
                     f"@group(0) @binding({b + 1}) var<storage, read> grad_{i}: array<f32>;",
                     f"@group(0) @binding({b + 2}) var<storage, read_write> m_{i}: array<f32>;",
                     f"@group(0) @binding({b + 3}) var<storage, read_write> v_{i}: array<f32>;"]
        functions.append(
            f"fn adamw_{i}(j: u32) {{\n"
            f"    let g = grad_{i}[j] * scale[0];\n"
            f"    let m = paramf(1u) * m_{i}[j] + (1.0 - paramf(1u)) * g;\n"
            f"    let v = paramf(2u) * v_{i}[j] + (1.0 - paramf(2u)) * g * g;\n"
            f"    m_{i}[j] = m;\n"
            f"    v_{i}[j] = v;\n"
            f"    let p = param_{i}[j] * (1.0 - step[0] * paramf(4u));\n"
            f"    param_{i}[j] = p - step[0] * (m / step[1]) / (sqrt(v / step[2]) + paramf(3u));\n}}")
        start = "0u" if i == 0 else f"ends[{i - 1}]"
        keyword = "if" if i == 0 else "} else if"
        adamw.append(f"    {keyword} (e < ends[{i}]) {{ adamw_{i}(e - {start});")
        squares.append(f"        {keyword} (e < ends[{i}]) {{ let x = grad_{i}[e - {start}]; s = s + x * x;")
    text = kernel_source("multi_tensor")
    fills = {"BINDINGS": "\n".join(bindings), "ADAMW_FUNCTIONS": "\n\n".join(functions),
             "ADAMW_SELECT": "\n".join(adamw) + "\n    }", "SQUARES_SELECT": "\n".join(squares) + "\n        }"}
    for key, value in fills.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def _chunks(items, size):
    return [items[i:i + size] for i in range(0, len(items), size)]


class MultiTensor:
    def __init__(self, runtime):
        self.rt = runtime
        limits = runtime.ctx.limits
        bindings = min(limits.get("max-storage-buffers-per-shader-stage", 8) - 4,  # step, scale, partials, ends
                       limits.get("max-bindings-per-bind-group", 1000) - 5)  # those and the uniform
        self.slots = max(1, min(MAX_SLOTS, bindings // 4))
        self.name = f"multi_tensor x{self.slots}"
        self.module = runtime.shader(generate(self.slots), self.name)
        # the kernels name every slot's bindings, so a group smaller than `slots` binds these in the gaps
        # (distinct buffers: two writable bindings may not share one); their index ranges are empty
        self.unused = [runtime.empty((1,)) for _ in range(4 * self.slots)]
        self._ends = {}  # a group's segment ends, uploaded once: a training step reuses the same groups

    def _or_unused(self, tensors, i, k):
        """Slot i's tensor of kind k (0 param, 1 grad, 2 m, 3 v), or its stand-in when the group is short."""
        return tensors[i] if i < len(tensors) else self.unused[4 * i + k]

    def ends(self, arrays):
        """The group's cumulative sizes as a u32 array on the GPU (unused slots: empty ranges)."""
        ends = tuple(np.cumsum([a.size for a in arrays]).tolist())
        ends += (ends[-1],) * (self.slots - len(ends))
        if ends not in self._ends:
            self._ends[ends] = self.rt.upload(np.array(ends, np.uint32))
        return self._ends[ends], ends[-1]

    def adamw(self, params, grads, exp_avgs, exp_avg_sqs, hyper, scale, beta1, beta2, eps, weight_decay):
        for group in _chunks(list(zip(params, grads, exp_avgs, exp_avg_sqs)), self.slots):
            kinds = list(zip(*group))  # (params, grads, ms, vs) of this group
            ends, total = self.ends(kinds[0])
            bindings = {0: hyper, 1: scale, 4: ends}
            bindings.update({5 + 4 * i + k: self._or_unused(kinds[k], i, k)
                             for i in range(self.slots) for k in range(4)})
            self.rt.dispatch(self.module, "adamw_main", -(-total // WG), bindings,
                             [total, float(beta1), float(beta2), float(eps), float(weight_decay), 0])

    def sum_squares(self, arrays, partials_of):
        """Record per-workgroup sums of squares of all arrays; returns (partials, how many it filled).
        partials_of(n) allocates the partials array once n is known."""
        groups = _chunks(list(arrays), self.slots)
        counts = [min(128, -(-sum(a.size for a in g) // (WG * 16))) for g in groups]  # ~16 elements a thread
        partials = partials_of(sum(counts))
        first = 0
        for group, n_groups in zip(groups, counts):
            ends, total = self.ends(group)
            bindings = {2: partials, 4: ends}
            bindings.update({6 + 4 * i: self._or_unused(group, i, 1) for i in range(self.slots)})
            self.rt.dispatch(self.module, "sum_squares_main", (n_groups, 1, 1), bindings,
                             [total, 0.0, 0.0, 0.0, 0.0, first])
            first += n_groups
        return partials, first
