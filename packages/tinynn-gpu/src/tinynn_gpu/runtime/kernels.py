"""Compiled kernels and prepared dispatches, each cached by what decides it.

- shader modules by the hash of their WGSL (`Shader`: the module, its Params layout and bindings by name), so
  that variants differing only in a constant are different shaders however they are labelled;
- pipelines by (module, entry point); uniform buffers by their bytes (a training step repeats its parameters);
- prepared dispatches (`Launch`: pipeline, binding slots, uniforms, workgroups) by what they hold, so one Launch
  stands for them all and keys its bind groups by identity;
- bind groups by (Launch, buffers): creating one costs ~50 us, and a training step repeats them all;
- an op's Launches by its shapes and parameters (`keep`), so that an eager op's repeat packs nothing.

Every cache forgets its oldest entry past CACHE_SIZE (`trim`).
"""
from __future__ import annotations

import hashlib

from tinynn_gpu.runtime.webgpu import wgpu

from tinynn_gpu.runtime.bindings import Bindings
from tinynn_gpu.runtime.params import ParamsLayout

MAX_GROUPS = 65535  # per dispatch dimension
WG = 256  # threads per workgroup of the 1-D kernels
CACHE_SIZE = 8192


class Shader:
    """A compiled shader module, the layout of its `struct Params`, its bindings by name, and the hash of its WGSL,
    which keys it."""
    __slots__ = ("module", "params", "bindings", "key", "label", "pipelines")

    def __init__(self, module, params: ParamsLayout | None, bindings: Bindings, key: str, label: str):
        self.module = module
        self.params = params
        self.bindings = bindings
        self.key = key
        self.label = label
        self.pipelines = {}  # entry point -> compute pipeline


class Launch:
    """A dispatch made ready by `KernelCache.prepare`: the pipeline, the binding slots, the buffers bound after the
    arrays (the uniforms of its parameters, or none) and the workgroup counts; `Runtime.launch` adds the arrays.
    One object per distinct content, so it keys its bind groups by identity: a key of (Launch, buffers) costs less
    to build and hash than one naming the pipeline, slots and uniforms."""
    __slots__ = ("shader", "entry", "pipeline", "slots", "uniforms", "groups")

    def __init__(self, shader: Shader, entry: str, pipeline, slots: tuple, uniforms: tuple, groups: tuple):
        self.shader, self.entry, self.pipeline = shader, entry, pipeline
        self.slots, self.uniforms, self.groups = slots, uniforms, groups


class KernelCache:
    def __init__(self, ctx, counters):
        self.ctx = ctx
        self.device = ctx.device
        self.counters = counters
        self.shaders = {}  # hash of the WGSL -> Shader
        self.files = {}  # kernel file name (a template's: its variant's key) -> Shader
        self.entry_points = {}  # (kernel file name or Shader, entry point, binding names) -> (Shader, pipeline, slots)
        self.uniforms = {}  # bytes -> uniform buffer
        self.prepared = {}  # (pipeline, slots, uniforms, workgroups) -> its one Launch
        self.bind_groups = {}  # (Launch, buffer, ...) -> bind group
        self.launches = {}  # an op's key (its shader, shapes and parameters) -> its Launch (`keep`)

    def shader(self, code: str, label: str, module=None) -> Shader:
        """The compiled module of this WGSL (compiled on first sight; `module`: already compiled)."""
        key = hashlib.sha256(code.encode()).hexdigest()
        shader = self.shaders.get(key)
        if shader is None:
            module = module or self.ctx.compile(label, code)
            shader = self.shaders[key] = Shader(module, ParamsLayout.parse(code, label), Bindings.parse(code, label),
                                                key, label)
        return shader

    def kernel(self, name: str) -> Shader:
        """A kernel file's module, compiled at start-up (context.KERNEL_FILES)."""
        shader = self.files.get(name)
        if shader is None:
            shader = self.files[name] = self.shader(self.ctx.sources[name], name, self.ctx.modules[name])
        return shader

    def pipeline(self, shader: Shader, entry: str):
        """The compute pipeline of one entry point, cached by the code it runs (a label can repeat)."""
        pipe = shader.pipelines.get(entry)
        if pipe is None:
            pipe = shader.pipelines[entry] = self.device.create_compute_pipeline(
                layout="auto", compute={"module": shader.module, "entry_point": entry},
                label=f"{shader.label}.{entry}")
        return pipe

    def uniform(self, data: bytes) -> object:
        """A uniform buffer holding these bytes, cached by them."""
        buf = self.uniforms.get(data)
        if buf is None:
            buf = self.uniforms[data] = self.device.create_buffer_with_data(data=data, usage=wgpu.BufferUsage.UNIFORM)
            trim(self.uniforms)
        return buf

    def bind_group(self, key: tuple):
        """The bind group of a key (Launch, buffer, ...): the buffers, then the Launch's uniforms, at its slots in
        order; made once and cached. Keyed by the objects in the caller's order: no sorting, and a key keeps its
        buffers alive."""
        group = self.bind_groups.get(key)
        if group is None:
            launch = key[0]
            entries = [{"binding": slot, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
                       for slot, buf in zip(launch.slots, key[1:] + launch.uniforms)]
            group = self.bind_groups[key] = self.device.create_bind_group(
                layout=launch.pipeline.get_bind_group_layout(0), entries=entries)
            self.counters["bind_groups_created"] += 1
            trim(self.bind_groups)
        return group

    def prepare(self, module, entry: str, groups, names: tuple, params=None, more_params=()) -> Launch | None:
        """One dispatch of `entry` in `module` (a kernel file's name, or a Shader) made ready, but for its arrays:
        `names` are the bindings they will fill, in order, as the WGSL names them; `params` (a dict of the module's
        `struct Params` fields) fills the uniform named `params`, and each (name, dict) of `more_params` another
        uniform of the same struct (a paired matmul's second problem); `groups` is a workgroup count or an
        (x, y, z) tuple. None: no workgroups, nothing to run. Names become slots once per (module, entry, names)."""
        if groups.__class__ is int:
            groups = (groups, 1, 1) if 0 < groups <= MAX_GROUPS else grid(groups)
        if 0 in groups:
            return None
        found = self.entry_points.get((module, entry, names))
        if found is None:
            shader = module if isinstance(module, Shader) else self.kernel(module)
            uniform_names = ("params", *(name for name, _ in more_params)) if shader.params is not None else ()
            slots = shader.bindings.slots(entry, (*names, *uniform_names))
            found = self.entry_points[(module, entry, names)] = (shader, self.pipeline(shader, entry), slots)
        shader, pipe, slots = found
        if shader.params is not None:
            uniforms = (self.uniform(shader.params.pack(params or {})),
                        *(self.uniform(shader.params.pack(values)) for _, values in more_params))
        elif params:
            raise ValueError(f"{shader.label} declares no struct Params, but was given {params}")
        else:
            uniforms = ()
        key = (pipe, slots, uniforms, groups)
        launch = self.prepared.get(key)
        if launch is None:
            launch = self.prepared[key] = Launch(shader, entry, pipe, slots, uniforms, groups)
            trim(self.prepared)
        return launch

    def keep(self, key: tuple, launch: Launch | None) -> Launch | None:
        """Keep an op's Launch under `key`, which names everything that decided it (the shader, the shapes, the
        parameters), and return it. The op looks there first:
        `launch = rt.launches.get(key) or rt.keep(key, rt.prepare(...))` prepares only on a miss."""
        self.launches[key] = launch
        trim(self.launches)
        return launch

    def forget_buffers(self, dead: set) -> None:
        """Drop the bind groups that name these (destroyed) buffers."""
        for key in [k for k in self.bind_groups if any(buf in dead for buf in k[1:])]:
            del self.bind_groups[key]


def trim(cache: dict) -> None:
    """Forget a cache's oldest entry once it holds more than CACHE_SIZE (first in, first out: a hit costs
    nothing to record, and a hot entry that ages out is made again once)."""
    if len(cache) > CACHE_SIZE:
        del cache[next(iter(cache))]


def groups(n: int) -> int:
    """Workgroups of WG threads covering n elements (the 1-D kernels: common.wgsl's element_index)."""
    return -(-n // WG)


def grid(workgroups: int) -> tuple[int, int, int]:
    """A workgroup count laid out as (x, y, 1) with x <= 65535; kernels recover the flat index."""
    if workgroups <= MAX_GROUPS:
        return (workgroups, 1, 1)
    return (MAX_GROUPS, -(-workgroups // MAX_GROUPS), 1)
