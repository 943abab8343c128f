"""Kernel parameters by name (params.py): the WGSL uniform layout of a `struct Params`, and packing dicts
into it. The runtime tests at the end dispatch through it on the GPU."""
import struct

import numpy as np
import pytest

from tinynn_gpu.matmul.lesson import lesson_source
from tinynn_gpu.runtime.context import KERNEL_FILES
from tinynn_gpu.runtime.params import ParamsLayout
from tinynn_gpu.runtime.wgsl import kernel_source

WGSL = """
struct Params {
    n: u32,              // elements
    scale: f32,
    offset: i32,
    shape: array<vec4<u32>, 2>,   // aligned to 16
    last: u32,
}
@group(0) @binding(3) var<uniform> params: Params;
"""


def test_offsets_follow_wgsl_uniform_layout():
    layout = ParamsLayout.parse(WGSL, "test")
    assert {k: v[0] for k, v in layout.fields.items()} == {"n": 0, "scale": 4, "offset": 8, "shape": 16, "last": 48}
    assert layout.size == 64  # 52 rounded up to 16


def test_pack_puts_each_value_at_its_offset_and_zero_elsewhere():
    layout = ParamsLayout.parse(WGSL, "test")
    data = layout.pack({"scale": 0.5, "n": 7, "offset": -3, "shape": (4, 5, 6), "last": 2**32 - 1})
    assert len(data) == 64
    assert struct.unpack_from("<Ifi", data, 0) == (7, 0.5, -3)
    assert struct.unpack_from("<8I", data, 16) == (4, 5, 6, 0, 0, 0, 0, 0)
    assert struct.unpack_from("<I", data, 48) == (2**32 - 1,)
    assert data[12:16] == bytes(4) and data[52:] == bytes(12)  # padding
    assert layout.pack({}) == bytes(64)  # every field not given is 0


def test_f32_and_u32_fields_pack_differently():
    layout = ParamsLayout.parse("struct Params { a: f32, b: u32 }")
    data = layout.pack({"a": 1, "b": 1})
    assert data[:8] == struct.pack("<fI", 1.0, 1)
    assert struct.unpack_from("<I", data, 0)[0] == 0x3F800000


def test_every_order_of_the_same_names_packs_alike_and_each_call_its_own_values():
    """pack keeps one picker per order of names: each order must place every value, and a kept picker must
    take the values of the dict in hand (and still refuse one that does not fit)."""
    layout = ParamsLayout.parse(WGSL, "test")
    first = layout.pack({"n": 7, "scale": 0.5, "last": 3})
    assert layout.pack({"last": 3, "scale": 0.5, "n": 7}) == first
    assert struct.unpack_from("<If", layout.pack({"n": 8, "scale": 2.5, "last": 3}), 0) == (8, 2.5)
    with pytest.raises(ValueError, match="'n' \\(u32\\) cannot hold -1"):
        layout.pack({"n": -1, "scale": 0.5, "last": 3})
    single = ParamsLayout.parse("struct Params { x: f32 }")
    assert single.pack({"x": 2.0}) == struct.pack("<f", 2.0) + bytes(12) and single.pack({}) == bytes(16)


def test_unknown_field_is_an_error_naming_it():
    layout = ParamsLayout.parse(WGSL, "elementwise")
    with pytest.raises(KeyError, match="elementwise: Params has no field 'rows'"):
        layout.pack({"rows": 3})


@pytest.mark.parametrize("values, message", [
    ({"n": -1}, "'n' \\(u32\\) cannot hold -1"),
    ({"n": 1.5}, "'n' \\(u32\\) cannot hold 1.5"),
    ({"offset": 2**31}, "'offset' \\(i32\\)"),
    ({"shape": [1, -2]}, "'shape' \\(u32\\) cannot hold -2"),
])
def test_a_value_that_does_not_fit_its_field_is_named(values, message):
    with pytest.raises(ValueError, match=message):
        ParamsLayout.parse(WGSL, "test").pack(values)


def test_an_array_longer_than_its_field_is_an_error():
    with pytest.raises(ValueError, match="'shape' holds 8 values, got 9"):
        ParamsLayout.parse(WGSL, "test").pack({"shape": range(9)})


def test_unsupported_field_types_are_refused_and_no_struct_means_no_params():
    with pytest.raises(ValueError, match="cannot read Params field 'v: vec3<f32>"):
        ParamsLayout.parse("struct Params { n: u32, v: vec3<f32> }", "bad")
    assert ParamsLayout.parse("@compute @workgroup_size(1) fn main() {}") is None


def test_lesson_params_stay_the_lessons_16_bytes():
    layout = ParamsLayout.parse(lesson_source(16), "lesson16")
    assert list(layout.fields) == ["p0", "p1", "p2", "p3"] and layout.size == 16


@pytest.mark.parametrize("name", KERNEL_FILES)
def test_every_kernel_file_declares_readable_params(name):
    assert ParamsLayout.parse(kernel_source(name), name) is not None


COPY = """
struct Params { n: u32, add: f32 }
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < params.n) { out[gid.x] = a[gid.x] * CONSTANT + params.add; }
}
"""


def test_shaders_that_differ_only_in_a_constant_run_their_own_code(gpu):
    """Two variants with the same label: each dispatch runs its own WGSL (the cache is keyed by the code)."""
    rt = gpu.rt
    x = rt.upload(np.arange(5, dtype=np.float32))
    results = []
    for constant in ("2.0", "3.0"):
        shader = rt.shader(COPY.replace("CONSTANT", constant), "same label")
        out = rt.empty((5,))
        rt.dispatch(shader, "main", 1, {"a": x, "out": out}, {"n": 5, "add": 0.5})
        results.append(rt.read(out))
    np.testing.assert_array_equal(results[0], np.arange(5) * 2 + 0.5)
    np.testing.assert_array_equal(results[1], np.arange(5) * 3 + 0.5)
    code = COPY.replace("CONSTANT", "2.0")
    assert rt.shader(code, "another label") is rt.shader(code, "same label")  # compiled once per code
