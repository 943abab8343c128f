"""Matmul kernels: the lesson's tiled kernel (lesson.wgsl, tile 8, 16 or 32).

`LessonMatmul.record` records `out[B,M,N] = op(a) @ op(b)` for any M, N, K, either operand stored
transposed, and b shared by every batch (a weight). Dispatch: x over rows, y over columns, z over batches.
"""
from __future__ import annotations

from tinynn_gpu.context import kernel_source
from tinynn_gpu.runtime import LESSON_PARAMS_BYTES

LESSON_TILES = (8, 16, 32)


def lesson_source(tile: int) -> str:
    if tile not in LESSON_TILES:
        raise ValueError(f"lesson matmul tile must be one of {LESSON_TILES}, got {tile}")
    return kernel_source("lesson").replace("{{TILE_AREA}}", str(tile * tile)).replace("{{TILE}}", str(tile))


class LessonMatmul:
    def __init__(self, runtime, tile: int = 16):
        self.rt = runtime
        self.tile = tile
        self.name = f"lesson{tile}"
        self.module = runtime.device.create_shader_module(label=self.name, code=lesson_source(tile))

    def describe(self) -> str:
        return f"lesson tiled {self.tile}x{self.tile}"

    def record(self, a, b, out, batch, m, n, k, transpose_a, transpose_b, shared_b):
        flags = int(transpose_a) | int(transpose_b) << 1 | int(shared_b) << 2
        groups = (-(-m // self.tile), -(-n // self.tile), batch)
        self.rt.dispatch(self.name, "matmul_main", groups, {0: a, 1: b, 2: out}, (m, n, k, flags),
                         module=self.module, params_bytes=LESSON_PARAMS_BYTES)
