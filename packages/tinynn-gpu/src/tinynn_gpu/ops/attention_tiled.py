"""The tiled attention forward (attention_tiled.wgsl): a register-blocked, matmul-like kernel, ROWS queries per
workgroup (4 a thread) and KEYS keys per step (SN a thread), filled in and unrolled per head size and tile.
`choose_tile` takes the first of TILES whose workgroup memory fits the device; TINYNN_ATTENTION_TILE=ROWSxKEYSxSN
forces one, =0 the per-row forward (attention.py)."""
from __future__ import annotations

from typing import NamedTuple

from tinynn.errors import TinynnError
from tinynn_gpu.runtime import settings
from tinynn_gpu.runtime.wgsl import kernel_file, kernel_source, unroll

THREADS = 256  # at most, per workgroup
XYZW = "xyzw"
FORWARD_TILE = "TINYNN_ATTENTION_TILE"


def choose(variable: str, forced: str | None, make, tiles: tuple, head_size: int, max_bytes: int, waste=None):
    """The first of `tiles` that runs the head size here, or None; with `waste` (a tile -> a number), the first of
    those with the least. `forced`, the setting of `variable`, forces one (settings.py checked its form), or
    none with 0."""
    if forced == "0":
        return None
    if forced:
        tile = make(*(int(n) for n in forced.split("x")))  # its form checked by settings.py
        why = tile.check(head_size, max_bytes)
        if why:
            raise TinynnError(f"{variable}={forced}: {why}")
        return tile
    runs = [tile for tile in tiles if not tile.check(head_size, max_bytes)]
    if not runs:
        return None
    return runs[0] if waste is None else min(runs, key=waste)  # min keeps the first of equals


class Tile(NamedTuple):
    """The tiled forward's blocking: ROWS queries per workgroup (4 a thread), KEYS keys per step (SN a thread)."""
    rows: int
    keys: int
    sn: int

    @property
    def tx(self) -> int:  # threads sharing a query row
        return self.keys // self.sn

    @property
    def threads(self) -> int:
        return self.tx * self.rows // 4

    def columns(self, head_size: int) -> int:
        """The vec4 columns of a value row its TX threads cover: the head's, rounded up to a multiple of TX."""
        return -(-(head_size // 4) // self.tx) * self.tx

    def workgroup_bytes(self, head_size: int) -> int:
        """Queries, keys (then values), probabilities and per-thread row parts, in padded vec4 rows."""
        hs4, ty = head_size // 4, self.rows // 4
        return 16 * (self.rows * (hs4 + 1) + self.keys * (self.columns(head_size) + 1) + self.keys * (ty + 1) +
                     self.tx * ty)

    def check(self, head_size: int, max_bytes: int) -> str:
        """Why this tile cannot run the head size here, or ""."""
        if self.rows % 4 or self.keys % self.sn or not 1 <= self.threads <= THREADS:
            return f"tile {self}: rows must be a multiple of 4, keys of sn, threads at most {THREADS}"
        if self.workgroup_bytes(head_size) > max_bytes:
            return f"tile {self}: head size {head_size} needs more than {max_bytes} bytes of workgroup memory"
        return ""

    def __str__(self) -> str:
        return f"{self.rows}x{self.keys}x{self.sn}"


# the tiled forward's tiles, fastest first (experiments/attention_tiles.py; BENCHMARKS.md, "Kernel tuning notes");
# 16x32x2 fits head size 128 in 32 KiB of workgroup memory. `choose_tile` passes over a tile whose row of TX threads
# pads the head's vec4 columns where another pads fewer: padded columns are work for nothing.
TILES = (Tile(32, 32, 2), Tile(64, 32, 4), Tile(16, 32, 2))


def choose_tile(head_size: int, max_bytes: int) -> Tile | None:
    """The tiled forward's tile, or None for the per-row kernel: of TILES that fit, the first whose threads sharing
    a query row pad the head's vec4 columns least (see TILES)."""
    return choose(FORWARD_TILE, settings.current().attention_tile, Tile, TILES, head_size, max_bytes,
                   waste=lambda tile: tile.columns(head_size))


def tiled_source(head_size: int, tile: Tile) -> str:
    """attention_tiled.wgsl for one head size and tile, its two products' inner steps unrolled: SCORE_STEP
    vec4s of the head (S) and VALUE_STEP keys (O) an iteration."""
    hs4, sn, tx = head_size // 4, tile.sn, tile.tx
    nq = tile.columns(head_size) // tx
    score_step = next(n for n in (4, 2, 1) if hs4 % n == 0)
    value_step = next(n for n in (8, 4, 2, 1) if tile.keys % n == 0)
    scores, values = [], []
    for u in range(score_step):
        scores += [f"            let q{i}_{u} = q_tile[4u * ty + {i}u][d + {u}u];" for i in range(4)]
        scores += [f"            let k{j}_{u} = kv_tile[tx + {j}u * TX][d + {u}u];" for j in range(sn)]
        scores += [f"            s_{i}_{j} = s_{i}_{j} + dot(q{i}_{u}, k{j}_{u});"
                   for i in range(4) for j in range(sn)]
    for u in range(value_step):
        values += [f"            let p{u} = p_tile[k + {u}u][ty];"]
        values += [f"            let v{q}_{u} = kv_tile[k + {u}u][tx + {q}u * TX];" for q in range(nq)]
        values += [f"            o_{i}_{q} = o_{i}_{q} + p{u}.{XYZW[i]} * v{q}_{u};"
                   for i in range(4) for q in range(nq)]
    text = kernel_source("attention_tiled", {
        "HEAD": kernel_file("attention_head"), "HS4": hs4, "ROWS": tile.rows, "KEYS": tile.keys, "SN": sn,
        "KV_STRIDE": tile.columns(head_size) + 1,
        "SCORE_STEP": score_step, "SCORES": "\n".join(scores), "VALUE_STEP": value_step,
        "VALUES": "\n".join(values),
        "ROW_MAXIMA": ", ".join(_max([f"s_{i}_{j}" for j in range(sn)]) for i in range(4)),
        "ROW_SUMS": ", ".join(" + ".join(f"p_{i}_{j}" for j in range(sn)) for i in range(4))})
    return unroll(text, {"$i": 4, "$j": sn, "$q": nq, "$r": -(-tile.keys * hs4 // tile.threads)})


def _max(terms: list[str]) -> str:
    """WGSL's max of the terms, as a balanced tree."""
    if len(terms) == 1:
        return terms[0]
    half = len(terms) // 2
    return f"max({_max(terms[:half])}, {_max(terms[half:])})"


