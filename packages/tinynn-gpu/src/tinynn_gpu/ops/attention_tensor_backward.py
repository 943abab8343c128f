"""The attention backward on tensor cores (attention_tensor_backward.wgsl), which runs in place of the tiled float32
backward where the matmul precision is "high" and the device has f16 subgroup matrices: its five products on
16 x 16 x 16 f16 matrices summing in f32, each f16 tile scaled by a power of two from its largest magnitude (the
method of attention_tensor.py, per tile rather than per line: dV's and dK's sums run over a step's queries, which
a per-row scale of dO or Q could not be divided out of). `emulate` as in attention_tensor.py.
"""
from __future__ import annotations

from typing import NamedTuple

from tinynn_gpu.ops.attention_backward_tiled import BackwardTile
from tinynn_gpu.ops.attention_tensor import PAD, S, TensorKernels, padded
from tinynn_gpu.ops.attention_tiled import THREADS
from tinynn_gpu.runtime.subgroup_matrices import Products, kernel_parts, opaque_16
from tinynn_gpu.runtime.wgsl import kernel_file, kernel_source, unroll


class BackwardTensorTile(NamedTuple):
    """KEYS keys per workgroup, QUERIES queries per step, THREADS threads (subgroups of 32)."""
    keys: int
    queries: int
    threads: int = 128  # Dawn takes a subgroup-matrix kernel whose workgroup is a multiple of the largest subgroup

    def stage_floats(self, head_size: int) -> int:
        """S beside dP ([query][key]), dV over dK ([key][column]), dQ ([query][column]): the most of them."""
        return max(self.queries, 2 * self.keys) * (max(2 * self.keys, padded(head_size)) + 4)

    def workgroup_bytes(self, head_size: int, half_bytes: int = 2) -> int:
        halves = 2 * (self.queries + self.keys) * (padded(head_size) + PAD) + 2 * self.queries * (self.keys + PAD)
        return half_bytes * halves + 4 * (self.stage_floats(head_size) + self.threads + self.queries + 3)

    def products(self, head_size: int) -> dict:
        """Each product's output rows and columns and its inner size."""
        hp = padded(head_size)
        return {"s": (self.queries, self.keys, hp), "dp": (self.queries, self.keys, hp),
                "dv": (self.keys, hp, self.queries), "dk": (self.keys, hp, self.queries),
                "dq": (self.queries, hp, self.keys)}

    def check(self, head_size: int, max_bytes: int, half_bytes: int = 2) -> str:
        """Why this tile cannot run the head size here, or ""."""
        hp4, subgroups = padded(head_size) // 4, self.threads // 32
        tq, tk = self.threads // max(1, self.queries), self.threads // max(1, self.keys)
        matrices = [m // S * (n // S) for m, n, _ in self.products(head_size).values()]
        if (self.queries % S or self.keys % S or self.threads % 32 or self.threads > THREADS or
                self.threads % self.queries or self.threads % self.keys or hp4 % tq or hp4 % tk or
                self.keys % tq or any(c % subgroups for c in matrices)):
            return (f"tensor attention backward tile {self}: head size {head_size} does not split evenly over its "
                    f"threads and subgroups")
        if self.workgroup_bytes(head_size, half_bytes) > max_bytes:
            return f"tensor attention backward tile {self}: head size {head_size} needs more than {max_bytes} " \
                   "bytes of workgroup memory"
        return ""

    part_floats = BackwardTile.part_floats  # the same dQ slices (attention_dq.wgsl)

    def __str__(self) -> str:
        return f"{self.keys}x{self.queries}x{self.threads}"


# 32 keys and 32 queries fit head size 64 in 48 KiB of workgroup memory; others run the float32 backward
BACKWARD_TENSOR_TILES = (BackwardTensorTile(32, 32),)


def choose_backward_tensor_tile(head_size: int, max_bytes: int, half_bytes: int = 2) -> BackwardTensorTile | None:
    return next((tile for tile in BACKWARD_TENSOR_TILES if not tile.check(head_size, max_bytes, half_bytes)), None)


# each product's operands: (tile, stride, layout) of the left and of the right matrix, where its output goes in
# the stage; an offset's {r} and {c} are the output matrix's first row and column, {k} its inner step's first
OPERANDS = {
    "s": (("q_tile", "T_STRIDE", "row_major"), ("k_tile", "T_STRIDE", "col_major"), "{r} * S_STRIDE + {c}"),
    "dp": (("g_tile", "T_STRIDE", "row_major"), ("v_tile", "T_STRIDE", "col_major"), "{r} * S_STRIDE + KEYS + {c}"),
    "dv": (("p_tile", "P_STRIDE", "col_major"), ("g_tile", "T_STRIDE", "row_major"), "{r} * S_STRIDE + {c}"),
    "dk": (("ds_tile", "P_STRIDE", "col_major"), ("q_tile", "T_STRIDE", "row_major"), "(KEYS + {r}) * S_STRIDE + {c}"),
    "dq": (("ds_tile", "P_STRIDE", "row_major"), ("k_tile", "T_STRIDE", "row_major"), "{r} * S_STRIDE + {c}"),
}


def offset(stride: str, major: str, rows: str, cols: str) -> str:
    """Where a matrix whose first row (of the matrix) is `rows` and first column `cols` starts in its tile."""
    return f"{rows} * {stride} + {cols}" if major == "row_major" else f"{cols} * {stride} + {rows}"


def product_lines(mm: Products, name: str, size: tuple, subgroups: int) -> list[str]:
    """One product: its output matrices dealt to the subgroups (matrix c to subgroup c % subgroups), each summed
    over the inner size and stored to the stage. Emulated, the matrices and inner steps are WGSL loops, not
    copies: lavapipe compiled the copies for minutes."""
    m, n, k = size
    (ltile, lstride, lmajor), (rtile, rstride, rmajor), store = OPERANDS[name]
    lines = []
    loops = mm.emulate
    for t in range(1 if loops else m // S * (n // S) // subgroups):
        r, c, acc = f"{name}_r{t}", f"{name}_c{t}", f"{name}_acc{t}"
        which = f"sg + {subgroups}u * t" if loops else f"sg + {subgroups * t}u"  # the output matrix
        if loops:
            lines.append(f"        for (var t = 0u; t < {m // S * (n // S) // subgroups}u; t = t + 1u) {{")
        lines += [f"        let {r} = ({which}) / {n // S}u * 16u;", f"        let {c} = ({which}) % {n // S}u * 16u;"]
        lines += mm.zero(acc)
        if loops:
            lines.append(f"        for (var j = 0u; j < {k // S}u; j = j + 1u) {{")
        for j in range(1 if loops else k // S):
            left, right, at = f"{name}_l{t}_{j}", f"{name}_x{t}_{j}", "16u * j" if loops else f"{S * j}u"
            lines += mm.load(left, "left", ltile, offset(lstride, lmajor, r, at), lstride, lmajor)
            lines += mm.load(right, "right", rtile, offset(rstride, rmajor, at, c), rstride, rmajor)
            lines += mm.multiply_add(left, right, acc)
        lines += ["        }"] * loops
        lines += mm.store(acc, "stage", store.format(r=r, c=c), "S_STRIDE")
        lines += ["        }"] * loops
    return lines


def backward_tensor_source(head_size: int, tile: BackwardTensorTile, emulate: bool = False, f16: bool = True) -> str:
    """attention_tensor_backward.wgsl for one head size and tile; emulate as attention_tensor.tensor_source."""
    hp4, subgroups = padded(head_size) // 4, tile.threads // 32
    mm = Products(emulate, steps=opaque_16("params.seq"))  # emulated: not unrolled, as in the forward
    sizes = tile.products(head_size)
    products = {part: "\n".join(line for name in names for line in product_lines(mm, name, sizes[name], subgroups))
                for part, names in (("SCORES", ("s", "dp")), ("KV", ("dv", "dk")), ("Q", ("dq",)))}
    enables, fills = kernel_parts(emulate, f16)
    text = kernel_source("attention_tensor_backward", {
        **fills, **products, "HEAD": kernel_file("attention_head"), "DQ": kernel_file("attention_dq"),
        "HS4": head_size // 4, "HP4": hp4, "KEYS": tile.keys, "QUERIES": tile.queries, "THREADS": tile.threads,
        "T_STRIDE": 4 * hp4 + PAD,
        "P_STRIDE": tile.keys + PAD, "S_STRIDE": max(2 * tile.keys, 4 * hp4) + 4,
        "STAGE": tile.stage_floats(head_size)})
    tq, tk = tile.threads // tile.queries, tile.threads // tile.keys
    return enables + unroll(text, {"$q": hp4 // tq, "$k": hp4 // tk, "$w": tile.keys // tq})


class TensorBackward(TensorKernels):
    """Compiles the tensor-core backward per head size on first use and records its two dispatches."""

    def tile(self, qkv_shape: tuple, n_head: int) -> BackwardTensorTile | None:
        """The tile this device runs the shape with, or None: too little workgroup memory, a head that splits
        unevenly, or dQ's slices past a storage binding (the float32 backward runs then)."""
        batch, seq, c3 = qkv_shape
        head_size = c3 // 3 // n_head
        tile = choose_backward_tensor_tile(head_size, self.max_bytes, 2 if self.f16 else 4)
        if tile is not None and 4 * tile.part_floats(batch, seq, n_head, head_size) > self.rt.max_binding:
            return None
        return tile

    def backward(self, g, qkv, y, lse, g_qkv, n_head: int, scale: float, tile: BackwardTensorTile | None = None):
        batch, seq, c3 = qkv.shape
        head_size = c3 // 3 // n_head
        tile = tile or self.tile(qkv.shape, n_head)
        shader = self.shader(backward_tensor_source, "attention tensor backward", head_size, tile)
        params = {"seq": seq, "n_head": n_head, "scale": scale}
        part = self.rt.empty((tile.part_floats(batch, seq, n_head, head_size),))
        self.rt.dispatch(shader, "attention_backward_kv_main", (batch * n_head, -(-seq // tile.keys), 1),
                         {"qkv": qkv, "g": g, "lse": lse, "y": y, "part": part, "out": g_qkv}, params)
        self.rt.dispatch(shader, "attention_backward_q_main", (-(-seq * head_size // 4 // 256), batch * n_head, 1),
                         {"part": part, "out": g_qkv}, params)
