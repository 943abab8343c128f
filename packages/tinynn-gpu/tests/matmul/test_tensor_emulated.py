"""The tensor-core matmul (matmul/tensor.py) with its subgroup matrices emulated in plain WGSL (`emulate=True`)
against float64 NumPy, outputs poisoned with NaN, on any adapter (lavapipe): everything in the kernel but the
matrix instructions is the real kernel's, byte for byte (checked here), so its staging, f16 conversion, range
scales, tile layouts, result slots, bounds, epilogues and split-K run where no tensor cores are. Each of
TENSOR_CONFIGS runs once, on the layout, shape and epilogue that `CASES` gives it, where its tiles fit the
adapter's workgroup memory (f32 tiles where it has no shader-f16), else on smaller tiles with the same matrices
a subgroup, buffering and split (`runnable`); together the cases cover every operand layout, loads checked and
not, quad and single-column stores, a batch with b of its own and b shared, M, N and K off the tile grid, every
epilogue and split-K. Operands of magnitude 1e-6 and 3e4 check the range scales."""
import dataclasses
import difflib
import re

import numpy as np
import pytest

from test_blocked import assert_matmul_result, epilogue_for, operands
from tinynn_gpu.matmul.configs import TENSOR_CONFIGS, TensorConfig
from tinynn_gpu.matmul.tensor import TensorMatmul, generate
from tinynn_gpu.runtime.subgroup_matrices import kernel_parts

HIGH_RTOL = 1e-3  # f16's 10-bit mantissa, relative to the size of the terms

# config: (transpose a, transpose b, batch, m, n, k, b shared, epilogue seed: test_blocked.epilogue_for's bits, 1
# bias, 2 GELU, 4 residual, 8 row sums, 16 GELU's gradient). Split configurations share their tile's module where
# the layout, checks and stores match (a compile less on lavapipe).
CASES = {
    "128x128x32/2x4": (False, False, 2, 130, 132, 40, True, 15),
    "128x128x32/2x4 db": (True, True, 1, 132, 130, 72, False, 17),  # N % 4 != 0: single-column stores
    "128x64x32/4x2": (True, False, 2, 128, 64, 64, False, 12),  # aligned: loads without checks
    "64x128x32/2x4": (False, True, 3, 66, 132, 36, True, 3),
    "64x64x32/2x2": (False, True, 2, 70, 50, 84, False, 0),
    "64x64x32/2x2 db": (True, False, 2, 68, 52, 100, True, 20),
    "128x128x32/2x4 split2": (False, False, 1, 130, 132, 100, True, 15),  # the last split's K ragged
    "64x64x32/2x2 split4": (False, True, 2, 70, 50, 100, True, 17),
    "64x64x32/2x2 split8": (True, True, 1, 64, 64, 256, False, 15),  # aligned, every split a whole chunk
    "64x128x64/2x4": (True, False, 2, 68, 136, 100, False, 9),
    "128x128x64/2x4": (False, True, 1, 130, 66, 200, False, 6),
    "128x128x32/2x2 db": (False, False, 2, 132, 136, 72, True, 17),
}


def stand_ins(config: TensorConfig) -> tuple:
    """The configuration, then smaller tiles with the same matrices a subgroup and buffering: BK = 16, then half the
    blocks on half the subgroups (fewer threads: more copies each, which compile slower), then both; a BK above 32
    is kept first, on half the blocks."""
    half = dataclasses.replace(config, bm=config.bm // 2, bn=config.bn // 2, sg_rows=max(1, config.sg_rows // 2),
                               sg_cols=max(1, config.sg_cols // 2))
    return (config, *[half] * (config.bk > 32), dataclasses.replace(config, bk=16), half,
            dataclasses.replace(half, bk=16))


def runnable(gpu, config: TensorConfig) -> TensorMatmul:
    """The emulated kernel of the first of `stand_ins` whose tiles fit here (lavapipe: 32 KiB of workgroup memory,
    f32 tiles on wgpu-native)."""
    for candidate in stand_ins(config):
        try:
            return TensorMatmul(gpu.rt, candidate, emulate=True)
        except ValueError:
            pass
    pytest.fail(f"no stand-in of {config.name} fits here")


def test_cases_cover_every_config_and_path():
    """CASES runs each configuration on a shape it takes, and between them every layout, checked and unchecked
    loads, quad and single stores, b shared and not, and each epilogue part."""
    assert set(CASES) == {c.name.removeprefix("tensor ") for c in TENSOR_CONFIGS}
    paths = set()
    for name, (ta, tb, batch, m, n, k, shared, seed) in CASES.items():
        config = TensorConfig.named(name)
        assert TensorConfig.uses_vec4(m, n, k, ta, tb), name
        aligned = {c.aligned(m, n, k, 1, k) for c in stand_ins(config)}
        assert len(aligned) == 1, f"{name}: the loads are checked on some adapters only"
        aligned = aligned.pop()
        paths |= {("layout", ta, tb), ("aligned", aligned), ("quads", n % 4 == 0), ("shared", shared),
                  ("double", config.double), ("split", config.splits > 1)}
        paths |= {("epilogue", bit) for bit in (1, 2, 4, 8, 16) if seed & bit}
    assert len(paths) == 4 + 2 * 5 + 5


@pytest.mark.parametrize("config", TENSOR_CONFIGS, ids=lambda c: c.name)
def test_emulated_config(poisoned, config):
    gpu = poisoned
    variant = runnable(gpu, config)
    print(f"runs {variant.describe()}")  # shown where it fails
    ta, tb, batch, m, n, k, shared, seed = CASES[config.name.removeprefix("tensor ")]
    case = (batch, m, n, k, ta, tb, shared, seed)
    a, b = operands(case)
    epilogue, expected = epilogue_for(case, gpu)
    out = gpu.rt.empty((batch, m, n))
    variant.record(gpu.from_numpy(a), gpu.from_numpy(b), out, batch, m, n, k, ta, tb, shared, epilogue)
    assert_matmul_result(gpu, out, epilogue, expected, a, b, ta, tb, HIGH_RTOL)


@pytest.mark.parametrize("scale_a, scale_b", [(1e-6, 1e-6), (3e4, 3e4), (1e-6, 3e4)])
def test_emulated_range(poisoned, rng, scale_a, scale_b):
    """Operands far outside f16's range (6e-8 to 65504) neither flush to zero nor overflow (overflow shows on
    f16 tiles only: f32 tiles rounded to f16's precision keep f32's range)."""
    gpu = poisoned
    variant = runnable(gpu, TensorConfig.named("64x64x32/2x2"))
    m, n, k = 70, 50, 84  # test_emulated_config's module for this configuration
    a = (rng.standard_normal((m, k)) * scale_a).astype(np.float32)
    b = (rng.standard_normal((n, k)) * scale_b).astype(np.float32)
    out = gpu.rt.empty((1, m, n))
    variant.record(gpu.from_numpy(a), gpu.from_numpy(b), out, 1, m, n, k, False, True, True)
    got = gpu.to_numpy(out)[0]
    want = a.astype(np.float64) @ b.T.astype(np.float64)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - want) <= HIGH_RTOL * np.linalg.norm(want)


# what the emulation writes in place of the subgroup matrices, and only there: the entry point without their
# builtins, the subgroup and invocation from the local index, the results' array, the products' loops and lines,
# and the stores into the subgroups' result slots
EMULATION = re.compile("|".join((
    r"fn matmul_main\(.*lid: u32\) \{", r"    let (sg|lane) = lid [%/] 32u;", r"    let (er|ec) = lane [%/] [\du %*]+;",
    r"    var acc: array<vec4<f32>, \d+u>;", r" *for \(var (ks|i|j|kk) = 0u; .*\) \{", r" *}",
    r" *let a = f32\(a_tile\[.*\]\);", r" *acc\[[^]]*\] = acc\[[^]]*\] \+ a \* vec4<f32>\(f32\(b_tile\[.*\]\)\);",
    r"    results\[slot \+ \(er\) \* 16u \+ ec \+ \du\] = acc\[\d+u( \+ 1u)?\]\.[xyzw];")))


HALF_F16, HALF_F32 = (kernel_parts(True, f16)[1]["HALF"] for f16 in (True, False))  # the tiles' type, rounding


def changed(before: list[str], after: list[str]) -> list[tuple[list[str], list[str]]]:
    """Each run of lines of `before` that `after` replaces, drops or inserts, with what it has there instead."""
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    return [(before[i1:i2], after[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


@pytest.mark.parametrize("config", [TENSOR_CONFIGS[0], TENSOR_CONFIGS[5]], ids=lambda c: c.name)
def test_emulation_changes_only_the_subgroup_matrices(config):
    """The emulated kernel is the real one but where the real one has subgroup matrices (their enable, builtins,
    results, loads, products and stores), which it replaces with `EMULATION`'s lines and no others, on every
    layout and form; and its f32 tiles differ from its f16 ones only in the f16 enable and `half`'s definition."""
    for ta, tb, aligned, quads in np.ndindex(2, 2, 2, 2):
        forms = bool(ta), bool(tb), bool(aligned), bool(quads)
        real = generate(config, *forms).splitlines()
        emulated = generate(config, *forms, emulate=True).splitlines()
        runs = changed(real, emulated)
        assert runs
        for before, after in runs:
            assert before and all("subgroup" in line or line.startswith("fn matmul_main(") or line == ""
                                  for line in before), before  # "": the real kernel's empty SUBGROUP line
            assert all(EMULATION.fullmatch(line) for line in after), [a for a in after if not EMULATION.fullmatch(a)]
        f32 = generate(config, *forms, emulate=True, f16=False).splitlines()
        assert changed(emulated, f32) == [(["enable f16;"], []), (HALF_F16.splitlines(), HALF_F32.splitlines())]
