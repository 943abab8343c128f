"""The emulated subgroup matrices (runtime/subgroup_matrices.py) against what the instructions are defined to do
(Dawn's chromium_experimental_subgroup_matrix): subgroupMatrixLoad reads element (row, col) of a row-major matrix at
offset + row * stride + col and of a column-major one at offset + col * stride + row, subgroupMatrixStore writes a
row-major result the same way, subgroupMatrixMultiplyAccumulate adds left @ right to the result. The tensor-core
kernels' emulated tests trust this, so a generator that passed a wrong layout or stride would fail them only if the
emulation reads as the hardware does: here it is pinned to the definition, every element written or left alone."""
import numpy as np
import pytest

from tinynn_gpu.runtime.subgroup_matrices import EMULATED_SUBGROUP, TO_HALF_F32, Products

OFFSETS = {"left": 5, "right": 3, "out": 7}
STRIDES = {"left": 40, "right": 36, "out": 20}  # between rows (row-major) or columns (column-major): no overlaps


def kernel(left_major: str, right_major: str) -> str:
    """One subgroup: out = left0 @ right0 + left1 @ right1, the second pair 16 along the inner dimension."""
    mm = Products(True)
    lines = mm.zero("acc")
    for step in range(2):
        inner = 16 * step  # the second matrices' first column (left) and row (right)
        left_at = f"{OFFSETS['left']}u + {inner * (1 if left_major == 'row_major' else STRIDES['left'])}u"
        right_at = f"{OFFSETS['right']}u + {inner * (STRIDES['right'] if right_major == 'row_major' else 1)}u"
        lines += mm.load(f"l{step}", "left", "x", left_at, f"{STRIDES['left']}u", left_major)
        lines += mm.load(f"r{step}", "right", "y", right_at, f"{STRIDES['right']}u", right_major)
        lines += mm.multiply_add(f"l{step}", f"r{step}", "acc")
    lines += mm.store("acc", "out", f"{OFFSETS['out']}u", f"{STRIDES['out']}u")
    body = "\n".join(lines)
    return f"""@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(32)
fn matrices_main(@builtin(local_invocation_index) lid: u32) {{
{EMULATED_SUBGROUP}
{body}
}}
"""


def matrix(array, offset: int, stride: int, major: str, rows: int, cols: int):
    """The rows x cols matrix at offset in array, read by the definition."""
    r, c = np.ogrid[:rows, :cols]
    return array[offset + r * stride + c] if major == "row_major" else array[offset + c * stride + r]


@pytest.mark.parametrize("left_major", ["row_major", "col_major"])
@pytest.mark.parametrize("right_major", ["row_major", "col_major"])
def test_emulated_matrices(poisoned, rng, left_major, right_major):
    gpu = poisoned
    x, y = rng.standard_normal(1400).astype(np.float32), rng.standard_normal(1400).astype(np.float32)
    out = gpu.rt.empty((OFFSETS["out"] + 16 * STRIDES["out"] + 5,))
    shader = gpu.rt.shader(kernel(left_major, right_major), "emulated subgroup matrices")
    gpu.rt.dispatch(shader, "matrices_main", (1, 1, 1), {"x": gpu.from_numpy(x), "y": gpu.from_numpy(y), "out": out})
    got = gpu.to_numpy(out)
    left = matrix(x, OFFSETS["left"], STRIDES["left"], left_major, 16, 32).astype(np.float64)  # (16, 32)
    right = matrix(y, OFFSETS["right"], STRIDES["right"], right_major, 32, 16).astype(np.float64)  # (32, 16)
    written = np.zeros(got.shape, bool)
    written[OFFSETS["out"] + np.arange(16)[:, None] * STRIDES["out"] + np.arange(16)] = True
    np.testing.assert_allclose(matrix(got, OFFSETS["out"], STRIDES["out"], "row_major", 16, 16), left @ right,
                               rtol=1e-5, atol=1e-5)
    assert np.isnan(got[~written]).all(), "the store wrote outside its 16 x 16 matrix"


def test_emulated_rounding_is_f16s(poisoned, rng):
    """The f32 tiles' `to_half` (where the device has no shader-f16) rounds as a conversion to f16 does: to the
    nearest of f16's values, subnormals included, and past f16's largest (65504) to an infinity, so that a kernel
    whose range scales let a tile overflow f16 fails the emulated tests as it would fail on tensor cores."""
    gpu = poisoned
    x = np.concatenate([
        rng.standard_normal(200) * 2.0 ** rng.integers(-30, 20, 200),  # normals, subnormals and overflows
        [0.0, -0.0, 65504.0, 65519.0, 65520.0, -65520.0, 1e5, -1e6, 3e38, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26,
         1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11],  # the largest, the first to overflow, ties to even
    ]).astype(np.float32)
    source = f"""@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
{TO_HALF_F32}

@compute @workgroup_size(64)
fn to_half_main(@builtin(global_invocation_id) id: vec3<u32>) {{
    if (id.x < arrayLength(&x)) {{ out[id.x] = to_half(x[id.x]); }}
}}
"""
    out = gpu.rt.empty(x.shape)
    gpu.rt.dispatch(gpu.rt.shader(source, "emulated to_half"), "to_half_main", (-(-x.size // 64), 1, 1),
                    {"x": gpu.from_numpy(x), "out": out})
    with np.errstate(over="ignore"):  # the overflows are the point
        want = x.astype(np.float16).astype(np.float32)
    got = gpu.to_numpy(out)
    wrong = np.flatnonzero(got != want)
    assert not wrong.size, f"to_half of {x[wrong[:5]].tolist()} gave {got[wrong[:5]].tolist()}, " \
                           f"not f16's {want[wrong[:5]].tolist()}"
