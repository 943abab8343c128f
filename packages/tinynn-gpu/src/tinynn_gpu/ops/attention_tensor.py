"""The attention forward on tensor cores (attention_tensor.wgsl), which runs in place of the tiled float32 forward
where the matmul precision is "high" and the device has f16 subgroup matrices (matmul/tensor.py's
`tensor_cores`, the matmuls' own check): S = Q K^T and O += P V on 16 x 16 x 16 f16 matrices summing in f32,
the softmax in f32, y and the logsumexp as the float32 forward writes them, so the float32 backward runs after it.

Range safety without an extra pass: a head's row (at most 128 floats) lies whole in the tile a workgroup stages,
so while staging it finds a power of two per query row, per key row and per value column of the step's keys that
brings the line's largest magnitude into [2^14, 2^15), multiplies before rounding to f16 and divides the f32
results by them (exact: powers of two). P lies in [0, 1]. So the error is f16's 10-bit mantissa relative to each
line's largest value, whatever the activations' magnitudes, as in the matmuls of "high" (matmul/scales.wgsl).

`emulate=True` builds the same kernel with each matrix product written out in plain WGSL over the same tiles,
offsets and strides (runtime/subgroup_matrices.py; f16 tiles where the device has shader-f16, else f32 rounded to
f16's precision): on an adapter without subgroup matrices (lavapipe) the tests run everything around the products
that way.
"""
from __future__ import annotations

from typing import NamedTuple

from tinynn_gpu.ops.attention_tiled import THREADS
from tinynn_gpu.runtime.subgroup_matrices import Products, kernel_parts, opaque_16
from tinynn_gpu.runtime.wgsl import kernel_file, kernel_source, unroll

S = 16  # a subgroup matrix's side
PAD = 8  # halves padding each tile row, against bank conflicts (16 bytes: rows stay 16-byte aligned)


class TensorTile(NamedTuple):
    """QUERIES queries per workgroup, KEYS keys per step, THREADS threads: subgroups of 32 in rows of SG_COLS,
    a row for each 16 queries."""
    queries: int
    keys: int
    threads: int = 128  # Dawn takes a subgroup-matrix kernel whose workgroup is a multiple of the largest subgroup

    @property
    def sg_cols(self) -> int:
        return self.threads // 32 // max(1, self.queries // S)

    def workgroup_bytes(self, head_size: int, half_bytes: int = 2) -> int:
        """The q, k, v and P tiles in halves, the f32 stage, and the staging maxima and scales."""
        hp = padded(head_size)
        halves = (self.queries + 2 * self.keys) * (hp + PAD) + self.queries * (self.keys + PAD)
        return (half_bytes * halves + 4 * self.queries * (max(self.keys, hp) + 4) + 20 * self.threads +
                4 * self.keys + 4 * hp)

    def check(self, head_size: int, max_bytes: int, half_bytes: int = 2) -> str:
        """Why this tile cannot run the head size here, or ""."""
        hp4 = padded(head_size) // 4
        tpr, tk, cols = self.threads // max(1, self.queries), self.threads // self.keys, self.sg_cols
        if (self.queries % S or self.keys % S or self.threads % 32 or self.threads > THREADS or
                self.threads != 32 * cols * (self.queries // S) or self.threads % self.queries or
                self.threads % self.keys or hp4 % tpr or self.keys % tpr or hp4 % tk or self.threads < hp4 or
                (self.keys // S) % cols or (hp4 // 4) % cols):
            return (f"tensor attention tile {self}: head size {head_size} does not split evenly over its threads "
                    f"and subgroups")
        if self.workgroup_bytes(head_size, half_bytes) > max_bytes:
            return f"tensor attention tile {self}: head size {head_size} needs more than {max_bytes} bytes of " \
                   "workgroup memory"
        return ""

    def __str__(self) -> str:
        return f"{self.queries}x{self.keys}x{self.threads}"


# the first that runs the head size is taken: 64 queries (4 x 1 subgroups) fit head sizes up to 64 in 48 KiB of
# workgroup memory, 32 (2 x 2) up to 128
TENSOR_TILES = (TensorTile(64, 32), TensorTile(32, 32))


def padded(head_size: int) -> int:
    """The head size padded with zero columns to whole matrices."""
    return -(-head_size // S) * S


def choose_tensor_tile(head_size: int, max_bytes: int, half_bytes: int = 2) -> TensorTile | None:
    return next((tile for tile in TENSOR_TILES if not tile.check(head_size, max_bytes, half_bytes)), None)


def score_lines(mm: Products, db: int, kb: int, cols: int) -> list[str]:
    """The subgroup's rows sr..sr+15 of Q (row-major) times K^T for its keys sk.. (the key tile read column-major)."""
    scores = [line for d in range(db) for line in
              mm.load(f"ql_{d}", "left", "q_tile", f"sr * T_STRIDE + {S * d}u", "T_STRIDE", "row_major")]
    for j in range(kb // cols):
        scores += mm.zero(f"sm_{j}")
        for d in range(db):
            scores += mm.load(f"kr_{j}_{d}", "right", "k_tile", f"(sk + {S * j}u) * T_STRIDE + {S * d}u",
                              "T_STRIDE", "col_major")
            scores += mm.multiply_add(f"ql_{d}", f"kr_{j}_{d}", f"sm_{j}")
        scores += mm.store(f"sm_{j}", "stage", f"sr * S_STRIDE + sk + {S * j}u", "S_STRIDE")
    return scores


def value_lines(mm: Products, db: int, kb: int, cols: int) -> list[str]:
    """Its rows of P times V for its head columns sd.., both row-major."""
    values = [line for j in range(kb) for line in
              mm.load(f"pl_{j}", "left", "p_tile", f"sr * P_STRIDE + {S * j}u", "P_STRIDE", "row_major")]
    for d in range(db // cols):
        values += mm.zero(f"om_{d}")
        for j in range(kb):
            values += mm.load(f"vr_{j}_{d}", "right", "v_tile", f"{S * j}u * T_STRIDE + sd + {S * d}u", "T_STRIDE",
                              "row_major")
            values += mm.multiply_add(f"pl_{j}", f"vr_{j}_{d}", f"om_{d}")
        values += mm.store(f"om_{d}", "stage", f"sr * S_STRIDE + sd + {S * d}u", "S_STRIDE")
    return values


def emulated_products(db: int, kb: int, cols: int) -> tuple[list[str], list[str]]:
    """score_lines' and value_lines' products emulated, their matrices and inner steps as WGSL loops, not copies:
    lavapipe compiled the copies for minutes."""
    mm = Products(True, steps=opaque_16("params.seq"))  # not unrolled: lavapipe compiles it in seconds

    def product(outer, inner, left, right, store):
        lines = [f"        for (var o = 0u; o < {outer}u; o = o + 1u) {{"] + mm.zero("acc")
        lines += [f"        for (var i = 0u; i < {inner}u; i = i + 1u) {{"]
        lines += mm.load("l", "left", *left) + mm.load("r", "right", *right) + mm.multiply_add("l", "r", "acc")
        return lines + ["        }"] + mm.store("acc", "stage", store, "S_STRIDE") + ["        }"]
    scores = product(kb // cols, db, ("q_tile", "sr * T_STRIDE + 16u * i", "T_STRIDE", "row_major"),
                     ("k_tile", "(sk + 16u * o) * T_STRIDE + 16u * i", "T_STRIDE", "col_major"),
                     "sr * S_STRIDE + sk + 16u * o")
    values = product(db // cols, kb, ("p_tile", "sr * P_STRIDE + 16u * i", "P_STRIDE", "row_major"),
                     ("v_tile", "16u * i * T_STRIDE + sd + 16u * o", "T_STRIDE", "row_major"),
                     "sr * S_STRIDE + sd + 16u * o")
    return scores, values


def tensor_source(head_size: int, tile: TensorTile, emulate: bool = False, f16: bool = True) -> str:
    """attention_tensor.wgsl for one head size and tile; emulate: its products in plain WGSL, on f16 tiles or (no
    f16) on f32 ones rounded to f16's precision."""
    hp = padded(head_size)
    db, kb = hp // S, tile.keys // S  # matrices along the head and along the step's keys
    cols = tile.sg_cols
    mm = Products(emulate)
    scores, values = (emulated_products(db, kb, cols) if emulate else
                      (score_lines(mm, db, kb, cols), value_lines(mm, db, kb, cols)))
    enables, fills = kernel_parts(emulate, f16)
    hp4 = hp // 4
    text = kernel_source("attention_tensor", {
        **fills, "HEAD": kernel_file("attention_head"), "HS4": head_size // 4, "HP4": hp4, "QUERIES": tile.queries,
        "KEYS": tile.keys, "THREADS": tile.threads, "SG_COLS": cols, "T_STRIDE": hp + PAD,
        "P_STRIDE": tile.keys + PAD, "S_STRIDE": max(tile.keys, hp) + 4, "SCORES": "\n".join(scores),
        "VALUES": "\n".join(values)})
    threads, tpr = tile.threads, tile.threads // tile.queries
    return enables + unroll(text, {"$q": hp4 // tpr, "$k": hp4 // (threads // tile.keys),
                                   "$v": -(-tile.keys // (threads // hp4)), "$w": tile.keys // tpr, "$u": hp4 // tpr})


class TensorKernels:
    """What the tensor-core forward and backward share: the device's workgroup memory, whether their tiles are f16
    (emulated on a device without shader-f16: f32), and their shaders, compiled once per head size and tile."""

    def __init__(self, runtime, emulate: bool = False):
        self.rt = runtime
        self.max_bytes = runtime.ctx.limits.get("max-compute-workgroup-storage-size", 16384)
        self.emulate = emulate
        self.f16 = not emulate or "shader-f16" in runtime.ctx.features
        self.shaders = {}  # (head size, tile) -> Shader

    def shader(self, source, name: str, head_size: int, tile):
        """source(head_size, tile, emulate, f16)'s shader, labelled with the kernel's name."""
        key = (head_size, tile)
        if key not in self.shaders:
            label = f"{name} hs{head_size} {tile}{' emulated' * self.emulate}"
            self.shaders[key] = self.rt.shader(source(head_size, tile, self.emulate, self.f16), label)
        return self.shaders[key]


class TensorAttention(TensorKernels):
    """Compiles the tensor-core forward per head size on first use and records its dispatch."""

    def tile(self, head_size: int) -> TensorTile | None:
        """The tile this device runs the head size with, or None (too little workgroup memory)."""
        return choose_tensor_tile(head_size, self.max_bytes, 2 if self.f16 else 4)

    def forward(self, qkv, y, lse, n_head: int, scale: float, tile: TensorTile | None = None) -> None:
        batch, seq, c3 = qkv.shape
        head_size = c3 // 3 // n_head
        tile = tile or self.tile(head_size)
        shader = self.shader(tensor_source, "attention tensor", head_size, tile)
        rt, key = self.rt, ("attention_tensor_forward", shader, batch, seq, n_head, scale)
        launch = rt.launches.get(key) or rt.keep(key, rt.prepare(
            shader, "attention_forward_main", (batch * n_head, -(-seq // tile.queries), 1), ("qkv", "out", "lse"),
            {"seq": seq, "n_head": n_head, "scale": scale}))
        rt.launch(launch, (qkv, y, lse))
