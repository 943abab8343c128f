"""Shader modules compiled without the WebGPU implementation's runtime checks, where it offers that.

WebGPU must not let a shader touch memory outside its bindings, so the shader compiler rewrites every dynamic
index into an array or buffer as a clamped one (`min(i, length - 1)`), and naga also bounds every loop with a
hidden counter. In a matmul's inner loop that is an extra instruction and a fresh address per load. Each
implementation has its way to drop them (webgpu.py picks it):
- wgpu-native 29 (wgpu-py 0.32) exports `wgpuDeviceCreateShaderModuleTrusted`, which takes the same WGSL with a
  mask of the checks to keep; we keep none (`trusted_modules`);
- Dawn drops Tint's robustness transform on a device opened with its `disable_robustness` toggle (webgpu.py asks
  for it), so every module of that device is compiled without it (`robustness_off`).
Our kernels guard their own indices (every load and store checks its row and column against the shape, loops
run to bounds the shader computes), and the kernel tests poison every array with NaN, draw shapes off every
tile edge and check that nothing past an array's end was written (the `poisoned` fixture), so a missing guard
fails a test rather than being papered over by a clamp. A write past the end of a buffer itself cannot be seen
that way; the pool's rounding up of sizes leaves most arrays a tail where it shows.

`probe` checks that the implementation's way is there and that a kernel compiled that way runs right;
otherwise (or with `TINYNN_SHADER_CHECKS=1`, to rule the checks out when a kernel misbehaves: on Dawn it also
opens the device with its robustness) modules keep the checks, and `tinynn info` says why.
"""
from __future__ import annotations

import numpy as np

from tinynn_gpu.runtime import settings, webgpu
from tinynn_gpu.runtime.bindings import Bindings

PROBE_WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&out)) { out[id.x] = f32(id.x) * 2.0 + 1.0; }
}
"""


def trusted_modules(device):
    """wgpu-native's: (compile, "") making modules through `wgpuDeviceCreateShaderModuleTrusted`, else (None, why)."""
    try:
        from wgpu.backends.wgpu_native import ffi, lib
        from wgpu.backends.wgpu_native._api import GPUShaderModule, libf, new_struct_p, to_c_string_view
        create = libf.wgpuDeviceCreateShaderModuleTrusted
    except (ImportError, AttributeError) as e:
        return None, f"wgpu-native offers no trusted shader modules here ({type(e).__name__}: {e})"

    def compile(label: str, code: str):
        source = new_struct_p("WGPUShaderSourceWGSL *", code=to_c_string_view(code))
        source[0].chain.next = ffi.NULL
        source[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
        descriptor = new_struct_p("WGPUShaderModuleDescriptor *", label=to_c_string_view(label),
                                  nextInChain=ffi.cast("WGPUChainedStruct *", source))
        handle = create(device._internal, descriptor, lib.WGPUShaderRuntimeChecks_None)
        if handle == ffi.NULL:
            raise RuntimeError(f"shader module {label!r} could not be created")
        return GPUShaderModule(label, handle, device)
    return compile, ""


def robustness_off(device):
    """Dawn's: (compile, "") where the device runs without robustness (every module it compiles), else (None, why)."""
    from wgpudawn.backends.dawn import extras
    if "disable_robustness" not in extras.get_toggles(device):
        return None, "the Dawn device was opened without its disable_robustness toggle"
    return (lambda label, code: device.create_shader_module(label=label, code=code)), ""


def probe(device):
    """(compile, "") where compile(label, code) makes a module without runtime checks, else (None, why)."""
    if settings.current().shader_checks:
        return None, "TINYNN_SHADER_CHECKS=1"
    compile, reason = webgpu.chosen().unchecked(device)
    if compile is None:
        return None, reason

    wgpu = webgpu.chosen().api
    try:
        n = 100
        buffer = device.create_buffer(size=4 * n, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        pipe = device.create_compute_pipeline(
            layout="auto", compute={"module": compile("unchecked probe", PROBE_WGSL), "entry_point": "main"})
        (slot,) = Bindings.parse(PROBE_WGSL, "unchecked probe").slots("main", ("out",))
        group = device.create_bind_group(layout=pipe.get_bind_group_layout(0),
                                         entries=[{"binding": slot, "resource": {"buffer": buffer}}])
        encoder = device.create_command_encoder()
        compute_pass = encoder.begin_compute_pass()
        compute_pass.set_pipeline(pipe)
        compute_pass.set_bind_group(0, group)
        compute_pass.dispatch_workgroups(2)
        compute_pass.end()
        device.queue.submit([encoder.finish()])
        got = np.frombuffer(device.queue.read_buffer(buffer), np.float32)
    except Exception as e:  # any failure means: compile with wgpu's checks
        return None, f"a kernel compiled without runtime checks failed ({type(e).__name__}: {e})"
    if not np.array_equal(got, np.arange(n, dtype=np.float32) * 2 + 1):
        return None, "a kernel compiled without runtime checks wrote wrong values"
    return compile, ""
