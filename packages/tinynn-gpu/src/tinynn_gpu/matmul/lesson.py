"""The lesson's tiled matmul (lesson.wgsl, tile 8, 16 or 32): the kernel a reader writes first, kept as a variant
the selector can force (TINYNN_MATMUL=lesson16). It has no epilogue: the backend applies one after it."""
from __future__ import annotations

from tinynn_gpu.matmul.configs import LESSON_TILES
from tinynn_gpu.matmul.problem import Epilogue
from tinynn_gpu.runtime.wgsl import kernel_source


def lesson_source(tile: int) -> str:
    if tile not in LESSON_TILES:
        raise ValueError(f"lesson matmul tile must be one of {LESSON_TILES}, got {tile}")
    return kernel_source("lesson", {"TILE_AREA": tile * tile, "TILE": tile})


class LessonMatmul:
    def __init__(self, runtime, tile: int = 16):
        self.rt = runtime
        self.tile = tile
        self.name = f"lesson{tile}"
        self.module = runtime.shader(lesson_source(tile), self.name)

    def describe(self) -> str:
        return f"lesson tiled {self.tile}x{self.tile}"

    def record(self, a, b, out, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue=Epilogue()) -> bool:
        """Record out = op(a) @ op(b); the lesson's kernel has no epilogue: False when one was asked for."""
        return self.plan(batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue)(a, b, out, epilogue)

    def plan(self, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue=Epilogue()):
        """record(a, b, out, epilogue) for this shape (see `MatmulSelector.plan`)."""
        flags = int(transpose_a) | int(transpose_b) << 1 | int(shared_b) << 2
        launch = self.rt.prepare(self.module, "matmul_main", (-(-m // self.tile), -(-n // self.tile), batch), ("a", "b", "out"),
                                 {"p0": m, "p1": n, "p2": k, "p3": flags})  # the lesson's own 16-byte Params

        def record(a, b, out, epilogue):
            self.rt.launch(launch, (a, b, out))
            return epilogue.empty
        return record
