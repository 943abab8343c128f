"""Multi-tensor optimizer kernels, generated from multi_tensor.wgsl for as many tensors per dispatch
as the device's storage-binding count allows (at most 64): AdamW (4 bindings a tensor) and the gradient
norm's sums of squares (1: a device with 32 storage bindings takes 7 tensors for AdamW, 30 for the norm)."""
from __future__ import annotations

import numpy as np

from tinynn_gpu.ops import group_sum
from tinynn_gpu.runtime.kernels import WG
from tinynn_gpu.runtime.wgsl import kernel_source

MAX_SLOTS = 64
ADAMW_CHUNK = WG * 8  # elements per workgroup: enough work to hide the slot look-up, enough workgroups to fill a GPU
# elements per sum_squares workgroup: enough workgroups to fill a GPU (a thread's chain of loads, four in flight,
# sets the time of a small model's norm, not the bandwidth), at most SQUARES_CHUNK so that a large model's
# partials stay few for norm_finish_main's single workgroup; a multiple of the 1024 a thread's loop steps by
SQUARES_WORKGROUPS = 2048
SQUARES_CHUNK = WG * 64


def squares_chunk(total: int) -> int:
    return min(SQUARES_CHUNK, 1024 * max(1, -(-total // (1024 * SQUARES_WORKGROUPS))))


def generate(slots: int, square_slots: int, subgroups: bool) -> str:
    """AdamW over `slots` tensors (4 bindings each), the sums of squares over `square_slots` (their gradients
    only: 1 binding each, so more of them fit a dispatch)."""
    bindings, adamw, squares, adamw_cases, squares_cases = [], [], [], [], []
    for i in range(max(slots, square_slots)):
        b = 5 + 4 * i
        bindings.append(f"@group(0) @binding({b + 1}) var<storage, read> grad_{i}: array<f32>;")
        if i < square_slots:
            squares.append(_squares_function(i))
            squares_cases.append(f"            case {i}u: {{ s = squares_{i}(work.lo, work.hi, lanes.lid); }}")
        if i >= slots:
            continue
        bindings += [f"@group(0) @binding({b}) var<storage, read_write> param_{i}: array<f32>;",
                     f"@group(0) @binding({b + 2}) var<storage, read_write> m_{i}: array<f32>;",
                     f"@group(0) @binding({b + 3}) var<storage, read_write> v_{i}: array<f32>;"]
        adamw.append(_adamw_function(i))
        adamw_cases.append(f"        case {i}u: {{ adamw_{i}(work.lo, work.hi, lanes.lid, work.weight_decay); }}")
    return kernel_source("multi_tensor", {
        "GROUP_SUM": group_sum.snippet(subgroups), "BINDINGS": "\n".join(bindings),
        "ADAMW_FUNCTIONS": "\n\n".join(adamw), "SQUARES_FUNCTIONS": "\n\n".join(squares),
        "ADAMW_CASES": "\n".join(adamw_cases), "SQUARES_CASES": "\n".join(squares_cases)})


def _adamw_function(i: int) -> str:
    """AdamW on one slot's elements [lo, hi): four elements' operands loaded before anything is stored (the
    stores could alias the next loads' bindings, so the compiler keeps a loop's loads behind its stores and
    each element would wait out its own trip to memory), then a tail one element at a time, the same
    arithmetic on every element."""
    def body(load, store) -> str:  # load(name): an operand's expression; store(name, value): its statements
        return "\n".join([
            f"        let g = {load('grad')} * scale[0];",
            f"        let m = params.beta1 * {load('m')} + (1.0 - params.beta1) * g;",
            f"        let v = params.beta2 * {load('v')} + (1.0 - params.beta2) * g * g;",
            f"        let p = {load('param')} * (1.0 - step[0] * weight_decay);",
            "        let p_new = p - step[0] * (m / step[1]) / (sqrt(v / step[2]) + params.eps);",
            store("m", "m"), store("v", "v"), store("param", "p_new")])
    four = body(lambda name: f"vec4<f32>({', '.join(f'{name}_{i}[k.{c}]' for c in 'xyzw')})",
                lambda name, value: "\n".join(f"        {name}_{i}[k.{c}] = {value}.{c};" for c in "xyzw"))
    one = body(lambda name: f"{name}_{i}[j]", lambda name, value: f"        {name}_{i}[j] = {value};")
    return (f"fn adamw_{i}(lo: u32, hi: u32, lid: u32, weight_decay: f32) {{\n"
            f"    var j = lo + lid;\n"
            f"    for (; j + 768u < hi; j = j + 1024u) {{\n"
            f"        let k = vec4<u32>(j, j + 256u, j + 512u, j + 768u);\n{four}\n    }}\n"
            f"    for (; j < hi; j = j + 256u) {{\n{one}\n    }}\n}}")


def _squares_function(i: int) -> str:
    return (
        f"fn squares_{i}(lo: u32, hi: u32, lid: u32) -> f32 {{\n"
        f"    var s = vec4<f32>(0.0);\n"
        f"    var j = lo + lid;\n"
        f"    for (; j + 768u < hi; j = j + 1024u) {{\n"
        f"        let x = vec4<f32>(grad_{i}[j], grad_{i}[j + 256u], grad_{i}[j + 512u], grad_{i}[j + 768u]);\n"
        f"        s = s + x * x;\n"
        f"    }}\n"
        f"    for (; j < hi; j = j + 256u) {{ let x = grad_{i}[j]; s.x = s.x + x * x; }}\n"
        f"    return (s.x + s.y) + (s.z + s.w);\n}}")


def _chunks(items, size):
    return [items[i:i + size] for i in range(0, len(items), size)]


class MultiTensor:
    def __init__(self, runtime):
        self.rt = runtime
        limits = runtime.ctx.limits
        storage = limits.get("max-storage-buffers-per-shader-stage", 8)
        bindings = limits.get("max-bindings-per-bind-group", 1000) - 5  # the shared ones and the uniform
        self.slots = max(1, min(MAX_SLOTS, (storage - 4) // 4, bindings // 4))  # + step, scale, partials, table
        self.square_slots = max(1, min(MAX_SLOTS, storage - 2, bindings // 4))  # + partials, table
        self._shaders = {}  # uses subgroups -> Shader
        self._tables = {}  # a group's table, uploaded once: a training step reuses the same groups
        kinds = ("param", "grad", "m", "v")  # a slot's bindings, as `generate` names them
        self._adamw_names = [[f"{kind}_{i}" for kind in kinds] for i in range(self.slots)]
        self._square_names = [f"grad_{i}" for i in range(self.square_slots)]

    def _module(self):
        """The kernels' shader, compiled on first use with the device's group_sum."""
        subgroups = self.rt.subgroups
        if subgroups not in self._shaders:
            name = f"multi_tensor x{self.slots}/{self.square_slots} [{'subgroup' if subgroups else 'workgroup'}]"
            self._shaders[subgroups] = self.rt.shader(generate(self.slots, self.square_slots, subgroups), name)
        return self._shaders[subgroups]

    def _or_unused(self, tensors, i, k):
        """Slot i's tensor of kind k (0 param, 1 grad, 2 m, 3 v), or its stand-in when the group is short: the
        kernels name every slot's bindings, so the gaps take distinct stand-ins (two writable bindings may not
        share a buffer), to which the group's table gives no work."""
        return tensors[i] if i < len(tensors) else self.rt.stand_in(4 * i + k)

    def table(self, arrays, chunk, weight_decays=None):
        """The group's table as a u32 array on the GPU (each workgroup's slot, then each slot's first
        workgroup, size and weight decay's float bits; multi_tensor.wgsl), and its workgroup count."""
        sizes = tuple(a.size for a in arrays)
        decays = tuple(weight_decays or (0.0,) * len(sizes))
        key = (sizes, chunk, decays)
        if key not in self._tables:
            counts = [-(-n // chunk) for n in sizes]
            firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
            slot_of = np.repeat(np.arange(len(sizes)), counts)  # (workgroups,)
            decay_bits = np.asarray(decays, np.float32).view(np.uint32)
            per_slot = np.stack([firsts, sizes, decay_bits], axis=1).reshape(-1)
            table = np.concatenate([slot_of, per_slot]).astype(np.uint32)
            self._tables[key] = (self.rt.upload(table), int(sum(counts)))
        return self._tables[key]

    def adamw(self, params, grads, exp_avgs, exp_avg_sqs, hyper, scale, beta1, beta2, eps, weight_decays):
        """weight_decays: one per parameter (parameter groups that differ only in it share a dispatch)."""
        module = self._module()
        for group in _chunks(list(zip(params, grads, exp_avgs, exp_avg_sqs, weight_decays)), self.slots):
            kinds = list(zip(*group))  # (params, grads, ms, vs, weight decays) of this group
            table, workgroups = self.table(kinds[0], ADAMW_CHUNK, kinds[4])
            bindings = {"step": hyper, "scale": scale, "table": table}
            bindings.update({name: self._or_unused(kinds[k], i, k)
                             for i, names in enumerate(self._adamw_names) for k, name in enumerate(names)})
            self.rt.dispatch(module, "adamw_main", workgroups, bindings,
                             {"chunk": ADAMW_CHUNK, "workgroups": workgroups, "beta1": beta1,
                              "beta2": beta2, "eps": eps})

    def sum_squares(self, arrays, partials_of):
        """Record per-workgroup sums of squares of all arrays; returns (partials, how many it filled).
        partials_of(n) allocates the partials array once n is known."""
        module = self._module()
        groups = _chunks(list(arrays), self.square_slots)
        chunk = squares_chunk(sum(a.size for a in arrays))
        tables = [self.table(group, chunk) for group in groups]
        partials = partials_of(max(1, sum(workgroups for _, workgroups in tables)))
        first = 0
        for group, (table, workgroups) in zip(groups, tables):
            bindings = {"partials": partials, "table": table}
            bindings.update({name: self._or_unused(group, i, 1) for i, name in enumerate(self._square_names)})
            self.rt.dispatch(module, "sum_squares_main", workgroups, bindings,
                             {"chunk": chunk, "workgroups": workgroups, "first_partial": first})
            first += workgroups
        return partials, first
