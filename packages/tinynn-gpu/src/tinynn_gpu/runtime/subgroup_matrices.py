"""The WGSL of f16 subgroup matrices (Dawn's chromium_experimental_subgroup_matrix: 16 x 16 matrices loaded from
workgroup memory, multiplied and accumulated in f32, stored back) for the tensor-core kernels, the matmul's
(matmul/tensor.py) and the attention's (ops/attention_tensor.py, attention_tensor_backward.py), or (emulate) plain
WGSL computing the same from the same memory: subgroups of 32 invocations by index, each invocation 8 neighbouring
results of a row (er, ec..ec+7) of each 16 x 16 result, read from the tiles at the offsets, strides and layouts
subgroupMatrixLoad reads. On an adapter without subgroup matrices (lavapipe) the tests run every kernel that way,
all but the matrix instructions themselves; tests/runtime/test_subgroup_matrices.py pins the emulation to what
the instructions do.
"""
from __future__ import annotations

INDENT = "        "

# f16's nearest value in an f32: its spacing at x is 2^-10 of x's power of two, 2^-24 among the subnormals
# (pack2x16float may flush those); past f16's largest, 65504, an infinity, as the conversion to f16 overflows (the
# bits of one: a constant infinity is rejected by Tint)
TO_HALF_F32 = ("fn to_half(x: f32) -> f32 {\n    let step = ldexp(1.0, max(frexp(x).exp - 11, -24));\n"
               "    let nearest = round(x / step) * step;\n"
               "    let infinity = bitcast<f32>(0x7f800000u | (bitcast<u32>(x) & 0x80000000u));\n"
               "    return select(nearest, infinity, abs(nearest) > 65504.0);\n}")
EMULATED_SUBGROUP = "    let sg = lid / 32u;\n    let lane = lid % 32u;\n    let er = lane / 2u;\n    let ec = lane % 2u * 8u;"


def enables(emulate: bool, f16: bool = True) -> str:
    """The enables a kernel starts with: f16 and subgroup matrices, or (emulate) f16 where the device has it."""
    if not emulate:
        return "enable f16;\nenable chromium_experimental_subgroup_matrix;\n"
    return "enable f16;\n" if f16 else ""


def kernel_parts(emulate: bool, f16: bool) -> tuple[str, dict]:
    """(the enables, the fills of HALF, BUILTINS and SUBGROUP) of a kernel whose entry point takes `lid` and uses
    `sg` and `lane` (the subgroup, the invocation in it): subgroup matrices, or (emulate) subgroups of 32 by index,
    on f16 tiles or f32 ones rounded to f16's precision (`half` and `to_half`)."""
    builtins = ", @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32"
    builtins, subgroup = (builtins, "") if not emulate else ("", EMULATED_SUBGROUP)
    half = "alias half = f16;\nfn to_half(x: f32) -> f16 { return f16(x); }" if f16 else \
        f"alias half = f32;\n{TO_HALF_F32}"
    return enables(emulate, f16), {"HALF": half, "BUILTINS": builtins, "SUBGROUP": subgroup}


class Products:
    """Matrix products' WGSL, statement by statement: subgroup matrices, or (emulate) plain WGSL computing the
    same, each invocation its 8 results (er, ec..ec+7) of a matrix. An accumulator is a name (emulated: its two
    vec4s name_a and name_b) or, emulated, the pair of vec4 expressions that hold it."""

    def __init__(self, emulate: bool, indent: str = INDENT, steps: str = "16u"):
        """steps: the emulated product's loop count, 16, or an expression of 16 the shader compiler cannot fold
        (`opaque_16`)."""
        self.emulate = emulate
        self.indent = indent
        self.steps = steps
        self.loaded = {}  # emulate: a matrix's name -> (tile, offset, stride, major)

    def load(self, name: str, kind: str, tile: str, offset: str, stride: str, major: str) -> list[str]:
        if self.emulate:
            self.loaded[name] = (tile, offset, stride, major)
            return []
        return [(f"{self.indent}let {name} = subgroupMatrixLoad<subgroup_matrix_{kind}<f16, 16, 16>, {major}>"
                 f"(&{tile}, {offset}, {stride});")]

    def zero(self, name: str) -> list[str]:
        if self.emulate:
            return [f"{self.indent}var {name}_a = vec4<f32>(0.0);", f"{self.indent}var {name}_b = vec4<f32>(0.0);"]
        return [f"{self.indent}var {name} = subgroup_matrix_result<f32, 16, 16>();"]

    def multiply_add(self, left: str, right: str, acc) -> list[str]:
        if not self.emulate:
            return [f"{self.indent}{acc} = subgroupMatrixMultiplyAccumulate({left}, {right}, {acc});"]
        ltile, *lplace = self.loaded[left]
        rtile, *rplace = self.loaded[right]
        first, second = halves(acc)
        at = self.indent

        def b(c):
            return ", ".join(f"f32({rtile}[{element(*rplace, 'kk', f'ec + {c + i}u')}])" for i in range(4))
        return [f"{at}for (var kk = 0u; kk < {self.steps}; kk = kk + 1u) {{",
                f"{at}    let a = f32({ltile}[{element(*lplace, 'er', 'kk')}]);",
                f"{at}    {first} = {first} + a * vec4<f32>({b(0)});",
                f"{at}    {second} = {second} + a * vec4<f32>({b(4)});",
                f"{at}}}"]

    def store(self, acc, array: str, offset: str, stride: str) -> list[str]:
        if not self.emulate:
            return [f"{self.indent}subgroupMatrixStore<row_major>(&{array}, {offset}, {acc}, {stride});"]
        parts = halves(acc)
        return [f"{self.indent}{array}[{element(offset, stride, 'row_major', 'er', f'ec + {c}u')}] = "
                f"{parts[c // 4]}.{'xyzw'[c % 4]};" for c in range(8)]


def opaque_16(uniform: str) -> str:
    """16, written so that the shader compiler cannot know it (a uniform u32 is never 2^32 - 1): lavapipe unrolls a
    product's loop of 16 steps, and its f16 loads then compile for a minute (with f16 tiles on Mesa 25)."""
    return f"16u + u32({uniform} == 4294967295u)"


def halves(acc) -> tuple[str, str]:
    """An emulated accumulator's two vec4s: columns ec..ec+3 and ec+4..ec+7 of its row er."""
    return acc if isinstance(acc, tuple) else (f"{acc}_a", f"{acc}_b")


def element(offset: str, stride: str, major: str, row: str, col: str) -> str:
    """The index of a loaded matrix's element (row, col) in its array."""
    return f"{offset} + ({row}) * {stride} + {col}" if major == "row_major" else \
        f"{offset} + ({col}) * {stride} + {row}"
