"""Fused causal self-attention on the GPU: kernels/attention.wgsl filled in and unrolled per head size and
layout, and the launches of its forward (one dispatch) and backward (two: dQ, then dK/dV).

A layout is (ROWS, SPLITS, LANES): a workgroup owns ROWS rows (queries; keys in the dK/dV kernel), LANES
threads share a row (subgroup shuffles add their parts of a dot product; 1 without the `subgroup` feature)
and SPLITS groups of threads walk over the other side interleaved. `choose_layout` takes ROWS and SPLITS
from LAYOUTS, the first whose workgroup memory fits the device; TINYNN_ATTENTION_LAYOUT=ROWSxSPLITS forces
one (experiments/attention_tiles.py times them all).
"""
from __future__ import annotations

import os

from tinynn.errors import TinynnError
from tinynn_gpu.context import kernel_source
from tinynn_gpu.group_sum import uses_subgroups

# fastest first, as timed on an H200 (experiments/attention_tiles.py): 8x4 beat 16x4, 16x2, 8x8 and 32x2 by
# 10-15% on the lesson, mid and big shapes; a single split was twice as slow
LAYOUTS = ((8, 4), (8, 2), (8, 1))
THREADS = 256  # at most, per workgroup
SUBGROUP_LANES = 4  # WebGPU's smallest subgroup


def unsupported_head_size(head_size: int) -> str:
    """Why the kernels cannot run this head size, or "" when they can."""
    if head_size % 4:
        return f"head size {head_size} is not a multiple of 4 (the kernels load vec4s)"
    if head_size > 128:
        return f"head size {head_size} exceeds 128 (the per-thread accumulators would spill)"
    return ""


def lanes_for(head_size: int, subgroups: bool) -> int:
    """Threads per row: the most, up to SUBGROUP_LANES, that split the row's vec4s evenly."""
    hs4 = head_size // 4
    return max(n for n in (1, 2, SUBGROUP_LANES) if hs4 % n == 0) if subgroups else 1


def workgroup_bytes(head_size: int, rows: int, splits: int) -> int:
    """The splits' padded accumulators and the forward's per-split maxima and sums."""
    return 16 * splits * rows * (head_size // 4 + 1) + 8 * splits * rows


def choose_layout(head_size: int, max_bytes: int) -> tuple[int, int]:
    forced = os.environ.get("TINYNN_ATTENTION_LAYOUT")
    if forced:
        try:
            rows, splits = (int(n) for n in forced.lower().split("x"))
        except ValueError:
            raise TinynnError(f"TINYNN_ATTENTION_LAYOUT must look like 16x4, got {forced!r}") from None
        if workgroup_bytes(head_size, rows, splits) > max_bytes:
            raise TinynnError(f"TINYNN_ATTENTION_LAYOUT={forced}: head size {head_size} needs more than the "
                              f"adapter's {max_bytes} bytes of workgroup memory")
        return rows, splits
    for rows, splits in LAYOUTS:
        if workgroup_bytes(head_size, rows, splits) <= max_bytes:
            return rows, splits
    raise TinynnError(f"attention: no layout fits head size {head_size} in {max_bytes} bytes of workgroup memory")


def lane_sum_body(lanes: int) -> str:
    """lane_sum's WGSL: a butterfly over the row's lanes, so that every lane gets the same bits."""
    lines = ["    var s = x;"]
    offset = 1
    while offset < lanes:
        lines.append(f"    s = s + subgroupShuffleXor(s, {offset}u);")
        offset *= 2
    return "\n".join(lines + ["    return s;"])


def source(head_size: int, rows: int, splits: int, lanes: int) -> str:
    if rows * splits * lanes > THREADS:
        raise TinynnError(f"attention layout {rows}x{splits} with {lanes} lanes exceeds {THREADS} threads")
    hs4 = head_size // 4
    text = kernel_source("attention", {"HS4": hs4, "ROWS": rows, "SPLITS": splits, "LANES": lanes,
                                       "LANE_SUM": lane_sum_body(lanes)})
    return unroll(text, {"$n": hs4 // lanes})


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
    """Compiles a kernel module per (head size, layout) on first use and records the dispatches."""

    def __init__(self, runtime):
        self.rt = runtime
        self.max_bytes = runtime.ctx.limits.get("max-compute-workgroup-storage-size", 16384)
        self.shaders = {}  # (head size, rows, splits, lanes) -> Shader

    def _shader(self, head_size: int):
        rows, splits = choose_layout(head_size, self.max_bytes)
        key = (head_size, rows, splits, lanes_for(head_size, uses_subgroups(self.rt.ctx)))
        if key not in self.shaders:
            self.shaders[key] = self.rt.shader(source(*key), f"attention hs{head_size} {rows}x{splits}x{key[3]}")
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
