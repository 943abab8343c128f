"""Fused causal self-attention on the GPU: kernels/attention.wgsl filled in and unrolled per head size and
tile, and the launches of its forward (one dispatch) and backward (two: dQ, then dK/dV).

A tile is (ROWS, COLS): a workgroup owns ROWS rows (queries; keys in the dK/dV kernel) and walks over the
other side COLS rows at a time. `choose_tiles` takes the first of TILES whose workgroup memory fits the
device; TINYNN_ATTENTION_TILES=ROWSxCOLS forces one (experiments/attention_tiles.py times them all).
"""
from __future__ import annotations

import os

from tinynn.errors import TinynnError
from tinynn_gpu.context import kernel_source

THREADS = 256  # at most, per workgroup
# fastest first, as timed on an H200 (experiments/attention_tiles.py): 16-row tiles give twice the workgroups
# of 32-row ones (the benchmark shapes fill the GPU only then) and waste less work on the causal diagonal
TILES = ((16, 16), (32, 32), (32, 16), (16, 8), (8, 8))


def unsupported_head_size(head_size: int) -> str:
    """Why the kernels cannot run this head size, or "" when they can."""
    if head_size % 4:
        return f"head size {head_size} is not a multiple of 4 (the kernels load vec4s)"
    if head_size > 128:
        return f"head size {head_size} exceeds 128 (the per-thread accumulators would spill)"
    return ""


def workgroup_bytes(head_size: int, rows: int, cols: int) -> int:
    """Workgroup memory of the largest kernel (dK/dV): four padded row tiles, two score tiles, lse/delta."""
    pad = head_size + 4  # a tile row, padded by one vec4
    return 4 * (2 * rows * pad + 2 * cols * pad + 2 * rows * (cols + 1) + 2 * rows + 2 * cols)


def choose_tiles(head_size: int, max_bytes: int) -> tuple[int, int]:
    forced = os.environ.get("TINYNN_ATTENTION_TILES")
    if forced:
        try:
            rows, cols = (int(n) for n in forced.lower().split("x"))
        except ValueError:
            raise TinynnError(f"TINYNN_ATTENTION_TILES must look like 32x16, got {forced!r}") from None
        if workgroup_bytes(head_size, rows, cols) > max_bytes:
            raise TinynnError(f"TINYNN_ATTENTION_TILES={forced}: head size {head_size} needs more than the "
                              f"adapter's {max_bytes} bytes of workgroup memory")
        return rows, cols
    for rows, cols in TILES:
        if workgroup_bytes(head_size, rows, cols) <= max_bytes:
            return rows, cols
    raise TinynnError(f"attention: no tile fits head size {head_size} in {max_bytes} bytes of workgroup memory")


def source(head_size: int, rows: int, cols: int) -> str:
    hs4 = head_size // 4
    per_row = max(d for d in range(1, hs4 + 1) if hs4 % d == 0 and d <= THREADS // rows)  # threads per row
    text = kernel_source("attention", {"HS4": hs4, "ROWS": rows, "COLS": cols, "R": per_row})
    return unroll(text, {"$c": hs4, "$n": hs4 // per_row, "$j": cols})


def unroll(text: str, counts: dict) -> str:
    """Repeat each code line that holds a marker once per value of it (0 .. count-1), the marker replaced."""
    lines = []
    for line in text.splitlines():
        copies = [line]
        for marker, count in counts.items():
            if marker in line and not line.lstrip().startswith("//"):
                copies = [copy.replace(marker, str(i)) for copy in copies for i in range(count)]
        lines += copies
    return "\n".join(lines) + "\n"


class Attention:
    """Compiles a kernel module per (head size, tile) on first use and records the dispatches."""

    def __init__(self, runtime):
        self.rt = runtime
        self.max_bytes = runtime.ctx.limits.get("max-compute-workgroup-storage-size", 16384)
        self.shaders = {}  # (head size, rows, cols) -> Shader

    def _shader(self, head_size: int):
        rows, cols = choose_tiles(head_size, self.max_bytes)
        key = (head_size, rows, cols)
        if key not in self.shaders:
            self.shaders[key] = self.rt.shader(source(*key), f"attention hs{head_size} {rows}x{cols}")
        return self.shaders[key], rows

    def forward(self, qkv, y, lse, n_head: int, scale: float) -> None:
        batch, seq, c3 = qkv.shape
        shader, rows = self._shader(c3 // 3 // n_head)
        self.rt.dispatch(shader, "attention_forward_main", (-(-seq // rows), batch * n_head, 1),
                         {0: qkv, 2: y, 4: lse}, {"seq": seq, "n_head": n_head, "scale": scale})

    def backward(self, g, qkv, y, lse, delta, g_qkv, n_head: int, scale: float) -> None:
        """g_qkv from g; delta (B, nh, T) is scratch: the dQ kernel saves rowsum(g * y) there for the dK/dV
        kernel."""
        batch, seq, c3 = qkv.shape
        shader, rows = self._shader(c3 // 3 // n_head)
        grid = (-(-seq // rows), batch * n_head, 1)
        bindings = {0: qkv, 1: g, 4: lse, 6: delta, 2: g_qkv}
        params = {"seq": seq, "n_head": n_head, "scale": scale}
        self.rt.dispatch(shader, "attention_backward_q_main", grid, {**bindings, 5: y}, params)
        self.rt.dispatch(shader, "attention_backward_kv_main", grid, bindings, params)
