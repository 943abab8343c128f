"""pack and unpack: many arrays into one flat array and back, up to SLOTS arrays per dispatch, generated
from pack.wgsl for as many slots as the device's storage bindings allow (at most 128: a GPT's
gradients and its loss in one dispatch on a large GPU). Data-parallel training (tinynn/train.py) packs the
gradients so that they are read back, summed over the MPI ranks and written back as one buffer."""
from __future__ import annotations

import numpy as np

from tinynn_gpu.runtime.arrays import bindable
from tinynn_gpu.runtime.kernels import groups
from tinynn_gpu.runtime.wgsl import kernel_source

MAX_SLOTS = 128
OPS = ("pack", "unpack")


def generate(op: str, slots: int) -> str:
    """The WGSL of `op` ("pack" or "unpack") over `slots` arrays."""
    slot_access, flat_access = ("read", "read_write") if op == "pack" else ("read_write", "read")
    bindings, cases = [], []
    for i in range(slots):
        bindings.append(f"@group(0) @binding({5 + i}) var<storage, {slot_access}> slot_{i}: array<u32>;")
        copy = f"flat[o] = slot_{i}[e - start];" if op == "pack" else f"slot_{i}[e - start] = flat[o];"
        cases.append(f"        case {i}u: {{ {copy} }}")
    fills = {"OP": op, "FLAT_ACCESS": flat_access, "BINDINGS": "\n".join(bindings), "SLOTS": str(slots),
             "CASES": "\n".join(cases)}
    return kernel_source("pack", fills)


class Packing:
    def __init__(self, runtime):
        self.rt = runtime
        limits = runtime.ctx.limits
        bindings = min(limits.get("max-storage-buffers-per-shader-stage", 8) - 2,  # flat and ends
                       limits.get("max-bindings-per-bind-group", 1000) - 3)  # those and the uniform
        self.slots = max(1, min(MAX_SLOTS, bindings))
        self.shaders = {op: runtime.shader(generate(op, self.slots), f"{op} x{self.slots}") for op in OPS}
        self._ends = {}  # a group's cumulative sizes, uploaded once: a training step packs the same arrays
        self._names = [f"slot_{i}" for i in range(self.slots)]  # as `generate` names them

    def copy(self, op: str, flat, arrays) -> None:
        """Record `op`: the arrays' elements into `flat` end to end (pack), or back out of it (unpack)."""
        first = 0
        for start in range(0, len(arrays), self.slots):
            group = arrays[start:start + self.slots]
            ends = tuple(np.cumsum([a.size for a in group]).tolist())
            ends += (ends[-1],) * (self.slots - len(group))
            if ends not in self._ends:
                self._ends[ends] = self.rt.upload(np.array(ends, np.uint32))
            bindings = {"flat": flat, "ends": self._ends[ends]}
            # a group smaller than `slots` binds distinct stand-ins in the gaps (unpack's are writable): empty ranges
            bindings.update({name: group[i] if i < len(group) else self.rt.stand_in(i)
                             for i, name in enumerate(self._names)})
            self.rt.dispatch(self.shaders[op], f"{op}_main", groups(ends[-1]), bindings,
                             {"count": ends[-1], "first": first})
            first += ends[-1]


def pack(self, arrays):
    """A method of the backend (backend.py's table), as are unpack and reduce_on_host_."""
    flat = self._empty((sum(a.size for a in arrays),), arrays[0].dtype)
    self.packing.copy("pack", flat, [bindable(a) for a in arrays])
    return flat


def unpack(self, flat, shapes):
    arrays = [self._empty(shape, flat.dtype) for shape in shapes]
    self.packing.copy("unpack", bindable(flat), arrays)
    return arrays
