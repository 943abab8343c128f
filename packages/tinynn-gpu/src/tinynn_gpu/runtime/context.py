"""The GPU context: adapter choice, the device, and the compiled shader modules, created once per process.

Adapter choice: `TINYNN_ADAPTER` (a substring of the adapter's name) when set; otherwise hardware first
(discrete, then integrated, then other), Vulkan/Metal/DX12 before OpenGL. Software adapters (lavapipe,
llvmpipe, SwiftShader: wgpu reports their type as CPU) come last; the backend marks them, and core's `auto`
device does not use them. Among equally good adapters, `TINYNN_ADAPTER_INDEX` picks one (modulo their count):
MPI rank r on a machine sets it to r (tinynn/distributed.py), so each rank has a GPU of its own where there
are enough. Any failure raises `BackendUnavailable` with the reason.

The WebGPU implementation (wgpu-native or Dawn) is webgpu.py's choice: the context asks it for the features by
its names, opens the device its way, and compiles WGSL in its dialect.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from tinynn.backends import BackendUnavailable
from tinynn.errors import TinynnError
from tinynn_gpu.runtime import settings, unchecked, webgpu
from tinynn_gpu.runtime.wgsl import kernel_source

# the limits we need above WebGPU's defaults (256 MiB buffers, 128 MiB storage bindings, 8 storage buffers)
WANTED_LIMITS = ("max-buffer-size", "max-storage-buffer-binding-size", "max-storage-buffers-per-shader-stage",
                 "max-bindings-per-bind-group",
                 "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                 "max-compute-workgroup-size-x", "max-compute-workgroup-size-y")
TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "Unknown": 3, "CPU": 4}
BACKEND_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 0, "OpenGL": 1}
STORAGE_BUFFERS_NEEDED = 10  # the most storage buffers one kernel binds (layernorm_backward_main, matmul_pair_main)
# the kernel files compiled as they are, at start-up, so that one a driver refuses is a reason and not a failed
# step; templates are compiled per variant by their launchers (group_sum.py's when the backend starts)
KERNEL_FILES = ("elementwise", "strided", "softmax", "embedding", "optimizer", "norm", "decode", "rows")


@dataclass
class GpuContext:
    adapter: object
    device: object
    info: dict
    limits: dict
    features: set
    modules: dict = field(default_factory=dict)  # kernel file name -> GPUShaderModule
    sources: dict = field(default_factory=dict)  # kernel file name -> its WGSL (as compiled)
    unchecked: object = None  # unchecked.probe's compile(label, code), when it works here
    checks_reason: str = ""  # why modules keep the runtime checks
    implementation: webgpu.Implementation = field(default_factory=webgpu.chosen)

    def compile(self, label: str, code: str):
        """A shader module of this WGSL, in the implementation's dialect: without runtime checks where unchecked.py
        found that works."""
        code = self.implementation.wgsl(code, self.features)
        if self.unchecked is not None:
            return self.unchecked(label, code)
        return self.device.create_shader_module(label=label, code=code)

    @property
    def adapter_name(self) -> str:
        return self.info.get("device") or self.info.get("description") or "unknown adapter"

    @property
    def name(self) -> str:
        """The adapter and the implementation that drives it (`tinynn bench` and `info` show it)."""
        return f"{self.adapter_name} on {self.implementation.name}"

    @property
    def subgroups(self) -> bool:
        return self.implementation.subgroups in self.features

    @property
    def threads_may_record(self) -> bool:
        """Whether a second thread may record commands on this device (Runtime.use_native)."""
        return self.implementation.threads_may_record(self.features)

    @property
    def is_software(self) -> bool:
        return is_software(self.info)

    def describe(self) -> dict:
        return {"adapter": self.adapter_name, "webgpu": self.implementation.describe(),
                "adapter_type": self.info.get("adapter_type"), "graphics_backend": self.info.get("backend_type"),
                "max_storage_binding_bytes": self.limits["max-storage-buffer-binding-size"],
                "max_storage_buffers_per_stage": self.limits.get("max-storage-buffers-per-shader-stage"),
                "timestamp_query": "timestamp-query" in self.features,
                "shader_runtime_checks": f"on ({self.checks_reason})" if self.unchecked is None else "off"}


def is_software(info: dict) -> bool:
    name = f"{info.get('device', '')} {info.get('description', '')}".lower()
    return info.get("adapter_type") == "CPU" or any(s in name for s in ("llvmpipe", "lavapipe", "swiftshader"))


def choose_adapter(adapters):
    wanted = settings.current().adapter
    if wanted:
        named = [a for a in adapters if wanted in str(a.info.get("device", "")).lower()]
        if not named:
            names = ", ".join(str(a.info.get("device")) for a in adapters) or "none"
            raise TinynnError(f"TINYNN_ADAPTER={wanted!r} matches no adapter (found: {names})")
        adapters = named

    def rank(a):
        info = a.info
        return (is_software(info), TYPE_RANK.get(info.get("adapter_type"), 3),
                BACKEND_RANK.get(info.get("backend_type"), 2))
    best = min(rank(a) for a in adapters)
    equals = [a for a in adapters if rank(a) == best]  # e.g. every GPU of one model in the machine, through Vulkan
    index = settings.current().adapter_index
    if not index.isdigit():
        raise TinynnError(f"TINYNN_ADAPTER_INDEX must be a whole number, got {index!r}")
    return equals[int(index) % len(equals)]


def create() -> GpuContext:
    """Pick an adapter, open the device with the adapter's own limits, compile every kernel module. The settings
    are read afresh here, once per process: core's data parallelism names this rank's adapter by setting
    TINYNN_ADAPTER_INDEX in the environment before it opens the backend (tinynn/distributed.py)."""
    settings.reload()
    implementation = webgpu.chosen()  # raises naming why it cannot be used
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # silences Mesa's startup complaint on headless Linux
    try:
        implementation.start()
        adapters = implementation.api.gpu.enumerate_adapters_sync()
    except Exception as e:
        raise BackendUnavailable(f"{implementation.name}'s adapter enumeration failed ({type(e).__name__}: {e})") \
            from None
    if not adapters:
        raise BackendUnavailable(f"no WebGPU adapter found by {implementation.name} ({implementation.no_adapter})")
    adapter = choose_adapter(adapters)
    limits = {k: adapter.limits[k] for k in WANTED_LIMITS if k in adapter.limits}
    features = set(adapter.features) & set(implementation.features)
    try:
        device = implementation.request_device(adapter, limits, sorted(features), settings.current().shader_checks)
    except Exception as e:
        raise BackendUnavailable(f"could not open {adapter.info.get('device')} on {implementation.name} "
                                 f"({type(e).__name__}: {e})") from None
    ctx = GpuContext(adapter, device, dict(adapter.info), dict(device.limits), set(device.features),
                     implementation=implementation)
    storage = ctx.limits.get("max-storage-buffers-per-shader-stage", 8)
    if storage < STORAGE_BUFFERS_NEEDED:  # refused here, not as a failed pipeline in the middle of a step
        raise BackendUnavailable(f"{ctx.name} binds {storage} storage buffers per shader stage; tinynn's kernels "
                                 f"need {STORAGE_BUFFERS_NEEDED}")
    ctx.unchecked, ctx.checks_reason = unchecked.probe(device)
    for name in KERNEL_FILES:
        try:
            ctx.sources[name] = kernel_source(name)
            ctx.modules[name] = ctx.compile(name, ctx.sources[name])
        except Exception as e:
            raise BackendUnavailable(f"kernel {name}.wgsl failed to compile on {ctx.name}: {e}") from None
    return ctx
