"""Every kernel we ship, generated variants included, is valid WGSL for Tint (Dawn's compiler, Chrome's) as
well as naga (wgpu's, which the rest of the suite runs on). Tint is stricter where the spec is: e.g. a
constant expression whose value is -inf or NaN is an error there, and naga lets it through.

Tint comes from the `wgpudawn` package: its Dawn build has a Null backend that compiles shaders and
pipelines with no GPU at all (selected by WGPU_BACKEND_TYPE=Null), so this runs on any CI machine. Each kernel
goes in as the runtime gives it to Dawn (runtime/webgpu.py's `Dawn.wgsl`: `enable subgroups;` where it uses
them), so the dialect is checked too.
"""
import os
import re

import pytest

from tinynn_gpu.matmul import blocked as matmul_blocked
from tinynn_gpu.matmul import tensor
from tinynn_gpu.matmul.configs import BLOCK_CONFIGS, LESSON_TILES, TENSOR_CONFIGS, BlockConfig
from tinynn_gpu.matmul.lesson import lesson_source
from tinynn_gpu.ops import (attention, attention_backward_tiled, attention_tensor, attention_tensor_backward,
                            attention_tiled, group_sum, multi_tensor)
from tinynn_gpu.ops import pack as packing
from tinynn_gpu.runtime.context import KERNEL_FILES
from tinynn_gpu.runtime.webgpu import Dawn
from tinynn_gpu.runtime.wgsl import kernel_source

if os.environ.get("TINYNN_REQUIRE_GPU") == "1":  # nox's tests-gpu installs it: there it must run
    import wgpudawn
else:
    wgpudawn = pytest.importorskip("wgpudawn")


@pytest.fixture(scope="module")
def tint():
    from wgpudawn.backends.dawn import _helpers, extras
    if _helpers._the_instance is None:  # (a Dawn session's backend made it with the same toggle: webgpu.py)
        extras.set_instance_extras(enable_toggles=["allow_unsafe_apis"])  # subgroup matrices are behind it
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WGPU_BACKEND_TYPE", "Null")
        adapter = wgpudawn.gpu.request_adapter_sync()
    assert adapter.info["backend_type"] == "Null"
    # subgroups for the subgroup forms; f16 and subgroup matrices for the tensor-core matmul (Null offers both)
    return adapter.request_device_sync(required_features=["subgroups", *tensor.FEATURES])


def every_kernel():
    yield from ((name, kernel_source(name)) for name in KERNEL_FILES + ("scales",))
    # every tensor-core variant: each layout, loads checked or not, float or quad stores
    for config in TENSOR_CONFIGS:
        for ta in (False, True):
            for tb in (False, True):
                yield from ((f"matmul {config.name} ta={ta:d} tb={tb:d} aligned={aligned} quads={quads}",
                             tensor.generate(config, ta, tb, aligned, quads))
                            for aligned in (False, True) for quads in (False, True))
                # and its emulated form (tests on adapters without subgroup matrices), on f16 tiles or f32
                yield from ((f"matmul {config.name} ta={ta:d} tb={tb:d} emulated f16={f16}",
                             tensor.generate(config, ta, tb, emulate=True, f16=f16)) for f16 in (False, True))
    yield from ((f"lesson{tile}", lesson_source(tile)) for tile in LESSON_TILES)
    designs = (BlockConfig(64, 64, 16, 8, 4, vec4=True, double=True, ahead=2),  # options no candidate uses
               BlockConfig(64, 64, 8, 4, 4, vec4=True, double=True, ahead=2, spread=True))
    for config in BLOCK_CONFIGS + designs:
        for ta in (False, True):
            for tb in (False, True):
                yield f"matmul {config.name} ta={ta:d} tb={tb:d}", matmul_blocked.generate(config, ta, tb, config.vec4)
                yield (f"matmul {config.name} ta={ta:d} tb={tb:d} aligned quads",  # (whole tiles: N a multiple of 4)
                       matmul_blocked.generate(config, ta, tb, config.vec4, aligned=True, quads=True))
        # a linear layer's gradients paired, either first (the longer K per split goes first), loads checked and
        # float stores, or neither
        for aligned in (False, True):
            inputs, weights = (False, False, config.vec4, aligned), (True, False, config.vec4, aligned)
            yield (f"matmul pair {config.name} aligned={aligned}",
                   matmul_blocked.generate_pair(config, inputs, weights, quads=aligned))
            yield (f"matmul pair {config.name} aligned={aligned} swapped",
                   matmul_blocked.generate_pair(config, weights, inputs, quads=aligned))
    # the group_sum and row-team kernels both ways
    for subgroups in (False, True):
        yield from ((f"{name} subgroups={subgroups}", group_sum.source(name, subgroups))
                    for name in ("reduce", "cross_entropy"))
        yield from ((f"layernorm subgroups={subgroups} width={width} step={step}",
                     group_sum.source("layernorm", subgroups, width, step))
                    for width in (1, 4) for step in (1, 2, 4, 8))
    yield from ((f"multi_tensor x{n}", multi_tensor.generate(n, min(4 * n + 2, multi_tensor.MAX_SLOTS), False))
                for n in range(1, multi_tensor.MAX_SLOTS + 1))  # a device's AdamW and norm slots go together so
    yield from ((f"multi_tensor x{n} subgroups", multi_tensor.generate(n, n, True))
                for n in (1, multi_tensor.MAX_SLOTS))
    yield from ((f"{op} x{n}", packing.generate(op, n)) for op in packing.OPS for n in (1, 7, packing.MAX_SLOTS))
    # one lane a row, and several (subgroup shuffles, which the uniformity analysis allows only where every
    # thread of the workgroup takes the same number of loop steps)
    for hs in (16, 20, 24, 64, 128):
        for lanes in {1, attention.lanes_for(hs, subgroups=True)}:
            yield from ((f"attention hs{hs} {rows}x{splits} lanes={lanes}", attention.source(hs, rows, splits, lanes))
                        for rows, splits in attention.LAYOUTS)
    yield from ((f"attention tiled hs{hs} {tile}", attention_tiled.tiled_source(hs, tile))
                for hs in (16, 20, 64, 128) for tile in attention_tiled.TILES)
    backward = attention_backward_tiled
    yield from ((f"attention backward hs{hs} {tile}", backward.backward_tiled_source(hs, tile))
                for hs in (32, 64, 128) for tile in backward.BACKWARD_TILES + (backward.BackwardTile(32, 16, 2),
                                                                               backward.BackwardTile(16, 8, 1))
                if not tile.check(hs, 1 << 20))
    # the tensor-core attention forward at head sizes padded to whole matrices and not, each tile that splits them,
    # on subgroup matrices (workgroups of 128: Dawn asks for a multiple of the largest subgroup, the Null device's
    # 128) and with its products written out (f16 tiles, or f32 ones rounded to f16) on the smaller tiles too
    tensor_tiles = attention_tensor.TENSOR_TILES + (attention_tensor.TensorTile(32, 32, 64),
                                                    attention_tensor.TensorTile(16, 16, 32))
    yield from tensor_sources("attention tensor", attention_tensor.tensor_source, tensor_tiles, (16, 20, 48, 64, 128))
    tensor_backward = attention_tensor_backward
    backward_tiles = tensor_backward.BACKWARD_TENSOR_TILES + (tensor_backward.BackwardTensorTile(16, 32, 64),
                                                              tensor_backward.BackwardTensorTile(16, 16, 32))
    yield from tensor_sources("attention tensor backward", tensor_backward.backward_tensor_source, backward_tiles,
                              (20, 64, 128))


def tensor_sources(name, source, tiles, head_sizes):
    """A tensor-core kernel at each head size, each tile that splits it: on subgroup matrices (tiles of 128 threads)
    and emulated, with f16 tiles and with f32 ones."""
    for hs in head_sizes:
        for tile in (t for t in tiles if not t.check(hs, 1 << 20)):
            if tile.threads == 128:
                yield f"{name} hs{hs} {tile}", source(hs, tile)
            for f16 in (True, False):
                yield f"{name} hs{hs} {tile} emulated f16={f16}", source(hs, tile, emulate=True, f16=f16)


def test_every_kernel_compiles_on_tint(tint):
    """Each module, with no warning, then each entry point's pipeline. The Null device has WebGPU's default limits only
    (8 storage buffers, 256 invocations), below what the big variants ask of a real GPU: a pipeline refused
    for a limit is not a WGSL error, so only those refusals pass."""
    failures, dawn = [], Dawn(api=wgpudawn, why="the Tint test")
    for name, code in every_kernel():
        code = dawn.wgsl(code, {"subgroups"})
        try:
            module = tint.create_shader_module(label=name, code=code)
        except Exception as e:
            failures.append(f"{name}: {str(e).strip().splitlines()[0]}")
            continue
        # a warning is a form Tint will drop (a deprecated builtin, say): it fails here before it fails there
        failures += [f"{name}: {m.type}: {m.message}" for m in module.get_compilation_info_sync().messages]
        for entry in re.findall(r"@compute[^{]*?\bfn\s+(\w+)", code):
            try:
                tint.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": entry})
            except Exception as e:
                if "exceeds the maximum" not in str(e) and "larger than the maximum allowed" not in str(e):
                    failures.append(f"{name}.{entry}: {str(e).strip().splitlines()[0]}")
    assert not failures, "\n".join(failures)


def test_tint_rejects_what_the_spec_forbids(tint):
    """The check above can fail: a constant -inf is refused."""
    code = "@compute @workgroup_size(1) fn main() { let x = bitcast<f32>(0xff800000u); }"
    with pytest.raises(Exception, match="cannot be represented"):
        tint.create_shader_module(code=code)
