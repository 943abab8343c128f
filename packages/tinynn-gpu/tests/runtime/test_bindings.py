"""Kernel arguments bound by the names the WGSL declares (runtime/bindings.py): names become slots when a dispatch
is prepared, and a misspelled, missing or unused name is refused there, by name."""
import re

import numpy as np
import pytest

from tinynn_gpu.ops import group_sum
from tinynn_gpu.runtime.bindings import Bindings
from tinynn_gpu.runtime.context import KERNEL_FILES
from tinynn_gpu.runtime.webgpu import wgpu

WGSL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;  // params: a comment naming a binding does not use it
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<storage, read> g: array<f32>;
struct Params { n: u32 }
fn load(i: u32) -> f32 { return x[i]; }
fn scaled(g: f32) -> f32 { let out = g * 2.0; return out; }  // a parameter and a local shadow bindings
@compute @workgroup_size(1)
fn forward_main(@builtin(workgroup_id) wg: vec3<u32>) { out[wg.x] = scaled(load(wg.x)) + f32(params.n); }
@compute @workgroup_size(1)
fn backward_main(@builtin(workgroup_id) wg: vec3<u32>) { out[wg.x] = g[wg.x]; }
"""


def test_names_are_read_from_the_declarations_and_entries_use_what_they_and_their_calls_name():
    bindings = Bindings.parse(WGSL, "example")
    assert bindings.slot == {"x": 0, "params": 3, "out": 5, "g": 7}
    assert bindings.entries == ("forward_main", "backward_main")
    assert bindings.used("forward_main") == {"x", "params", "out"}  # x through load, params and out itself
    assert bindings.used("backward_main") == {"out", "g"}
    assert bindings.slots("forward_main", ("out", "x", "params")) == (5, 0, 3)  # in the order given


@pytest.mark.parametrize("names, named", [
    (("x", "outt", "params"), "'outt'"),  # misspelled: no such binding
    (("x", "params"), "'out' not given"),  # missing
    (("x", "out", "g", "params"), "'g' not used"),  # declared, but not this entry point's
    (("x", "x", "out", "params"), "given twice"),
])
def test_a_wrong_name_is_refused_naming_it(names, named):
    with pytest.raises(ValueError, match=re.escape(named)) as caught:
        Bindings.parse(WGSL, "example").slots("forward_main", names)
    assert "example.forward_main" in str(caught.value)


def test_a_wrong_name_is_refused_when_the_dispatch_is_prepared(gpu):
    """At prepare time, before anything is recorded or a bind group made."""
    rt = gpu.rt
    before = rt.counters["dispatches"]
    with pytest.raises(ValueError, match="'outt'"):
        rt.prepare("elementwise", "unary_main", 1, ("a", "outt"), {"n": 1, "op": 0})
    with pytest.raises(ValueError, match="'out' not given"):
        rt.prepare("elementwise", "unary_main", 1, ("a",), {"n": 1, "op": 0})
    x = rt.upload(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="'b' not used"):
        rt.dispatch("elementwise", "unary_main", 1, {"a": x, "b": x, "out": rt.empty((4,))}, {"n": 4, "op": 0})
    assert rt.counters["dispatches"] == before


def test_every_entry_point_binds_exactly_what_its_pipeline_layout_holds(gpu):
    """What `used` finds for each entry point of every kernel file is what wgpu's automatic layout holds: a bind
    group of just those bindings is valid (one binding more or less would not be)."""
    rt, device = gpu.rt, gpu.rt.device
    shaders = [rt.kernels.kernel(name) for name in KERNEL_FILES] + \
        [group_sum.shader(rt, name) for name in group_sum.TEMPLATES]
    storage = device.create_buffer(size=4096, usage=wgpu.BufferUsage.STORAGE)
    uniform = device.create_buffer(size=4096, usage=wgpu.BufferUsage.UNIFORM)
    checked = 0
    for shader in shaders:
        for entry in shader.bindings.entries:
            pipe = rt.kernels.pipeline(shader, entry)
            used = sorted(shader.bindings.used(entry))
            # distinct buffers per writable binding are not needed for validity of the layout, only of a dispatch
            entries = [{"binding": shader.bindings.slot[name],
                        "resource": {"buffer": uniform if name.startswith("params") else storage, "offset": 0,
                                     "size": 4096}} for name in used]
            device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=entries)
            checked += 1
    assert checked > 30
    shader = rt.kernels.kernel("elementwise")  # and the check can fail: one binding more, or one fewer, is refused
    pipe = rt.kernels.pipeline(shader, "unary_main")
    for names in (("a", "b", "out", "params"), ("out", "params")):
        entries = [{"binding": shader.bindings.slot[name], "resource": {
            "buffer": uniform if name == "params" else storage, "offset": 0, "size": 4096}} for name in names]
        with pytest.raises(Exception):
            device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=entries)
