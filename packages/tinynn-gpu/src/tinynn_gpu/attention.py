"""Fused causal self-attention on the GPU: the launches of its forward (one dispatch) and backward (two), from
templates filled in and unrolled per head size.

The forward is kernels/attention_tiled.wgsl, a register-blocked matmul-like kernel, with the first tile of
TILES whose workgroup memory fits the device; where none fits, attention.wgsl's per-row forward runs.
TINYNN_ATTENTION_TILE=ROWSxKEYSxSN forces a tile, =0 the per-row forward.

The backward is kernels/attention_backward_tiled.wgsl (dK, dV and dQ's per-key-block slices, then dQ as the
slices' sum) with the first tile of BACKWARD_TILES that fits the head size and the device; where none does
(head sizes 16 and 20, too little workgroup memory, or dQ slices past a storage binding: they grow as T^2),
attention.wgsl's per-row kernels (dQ, then dK/dV).
TINYNN_ATTENTION_BACKWARD_TILE=KEYSxQUERIESxSN forces a tile, =0 the per-row kernels. On an H200 the tiled
backward took 0.57-0.82x the per-row kernels' time at every shape measured, T = 32 to 256 (BACKWARD_TILES has
the figures), so no sequence length keeps the per-row kernels; head size 128 was a tie.

The per-row kernels: a layout is (ROWS, SPLITS, LANES): a workgroup owns ROWS rows (queries; keys in the
dK/dV kernel), LANES threads share a row (subgroup shuffles add their parts of a dot product; 1 without the
`subgroup` feature) and SPLITS groups of threads walk over the other side interleaved. `choose_layout` takes
ROWS and SPLITS from LAYOUTS, the first whose workgroup memory fits the device; TINYNN_ATTENTION_LAYOUT=
ROWSxSPLITS forces one (experiments/attention_tiles.py times them all, and every tile).
"""
from __future__ import annotations

import os
from typing import NamedTuple

from tinynn.errors import TinynnError
from tinynn_gpu.context import kernel_file, kernel_source, unroll
from tinynn_gpu.runtime import MAX_GROUPS

# fastest first, as timed on an H200 (experiments/attention_tiles.py): 8x4 beat 16x4, 16x2, 8x8 and 32x2 by
# 10-15% on the lesson, mid and big shapes; a single split was twice as slow
LAYOUTS = ((8, 4), (8, 2), (8, 1))
THREADS = 256  # at most, per workgroup
SUBGROUP_LANES = 4  # WebGPU's smallest subgroup
XYZW = "xyzw"
FORWARD_TILE, BACKWARD_TILE = "TINYNN_ATTENTION_TILE", "TINYNN_ATTENTION_BACKWARD_TILE"  # force a tile, or 0


def unsupported(qkv_shape: tuple, n_head: int) -> str:
    """Why the kernels cannot run attention on a qkv of this shape (B, T, 3C), or "" when they can."""
    head_size = qkv_shape[-1] // 3 // n_head
    if head_size % 4:
        return f"head size {head_size} is not a multiple of 4 (the kernels load vec4s)"
    if head_size > 128:
        return f"head size {head_size} exceeds 128 (the per-thread accumulators would spill)"
    heads = qkv_shape[0] * n_head
    if heads > MAX_GROUPS:  # every grid has a dimension of one row of workgroups per head
        return f"{heads} heads (batch x n_head) exceed a dispatch dimension's {MAX_GROUPS}"
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


# the tiled forward's tiles, fastest first, as timed on an H200 (experiments/attention_tiles.py, us a call, session
# 15, query blocks in the grid's y, the last first): 32x32x2 17.4 lesson, 21.9 mid, 51.9 big, 55.3 at head size 128
# (64x32x4 19.3, 25.9, 52.4; 64x32x2 19.4, 27.0, 59.1). 16x32x2 fits head size 128 in 32 KiB (lavapipe): 98.2 on the
# H200. The per-row forward took 1.3-1.8x 64x32x4's time (session 7). `choose_tile` passes over a tile whose row of
# TX threads pads the head's vec4 columns where another pads fewer: at head size 32 (8 columns) 32x32x2's 16 threads
# a row took 20.5 us, 64x32x4's 8 took 19.1.
TILES = (Tile(32, 32, 2), Tile(64, 32, 4), Tile(16, 32, 2))


def _choose(variable: str, make, tiles: tuple, example: str, head_size: int, max_bytes: int, waste=None):
    """The first of `tiles` that runs the head size here, or None; with `waste` (a tile -> a number), the first of
    those with the least. `variable` forces one (written like `example`), or none with 0."""
    forced = os.environ.get(variable)
    if forced == "0":
        return None
    if forced:
        try:
            tile = make(*(int(n) for n in forced.lower().split("x")))
        except (TypeError, ValueError):
            raise TinynnError(f"{variable} must look like {example} or 0, got {forced!r}") from None
        why = tile.check(head_size, max_bytes)
        if why:
            raise TinynnError(f"{variable}={forced}: {why}")
        return tile
    runs = [tile for tile in tiles if not tile.check(head_size, max_bytes)]
    if not runs:
        return None
    return runs[0] if waste is None else min(runs, key=waste)  # min keeps the first of equals


def choose_tile(head_size: int, max_bytes: int) -> Tile | None:
    """The tiled forward's tile, or None for the per-row kernel: of TILES that fit, the first whose threads sharing
    a query row pad the head's vec4 columns least (see TILES)."""
    return _choose(FORWARD_TILE, Tile, TILES, "64x32x2 (rows, keys, keys a thread)", head_size, max_bytes,
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


class BackwardTile(NamedTuple):
    """The tiled backward's blocking: KEYS keys per workgroup, QUERIES queries per step (4 a thread in S and
    dP), SN keys a thread in S and dP."""
    keys: int
    queries: int
    sn: int

    @property
    def threads(self) -> int:
        return self.keys // self.sn * (self.queries // 4)

    def workgroup_bytes(self, head_size: int) -> int:
        """k, v, q and g tiles in padded vec4 rows, P and dS by key and query quad, delta's parts and lse."""
        hs4 = head_size // 4
        return (16 * (2 * (self.keys + self.queries) * (hs4 + 1) + 2 * self.keys * (self.queries // 4 + 1)) +
                4 * (self.threads + self.queries))

    def counts(self, head_size: int) -> dict:
        """The unrolled copies: keys a thread owns in dK/dV ($o), query quads in dQ ($u), vec4s a thread loads
        of a query row ($r) and of the key and value tiles ($k)."""
        hs4, threads = head_size // 4, self.threads
        group = threads // hs4
        return {"$i": 4, "$j": self.sn, "$o": self.keys // group, "$u": self.queries // 4 // group,
                "$r": self.queries * hs4 // threads, "$k": self.keys * hs4 // threads}

    def check(self, head_size: int, max_bytes: int) -> str:
        """Why this tile cannot run the head size here, or ""."""
        hs4, threads = head_size // 4, self.threads
        if (self.keys % self.sn or self.queries % 4 or self.keys % self.queries or not 1 <= threads <= THREADS or
                threads % hs4):
            return (f"backward tile {self}: keys must be a multiple of sn and of queries, queries of 4, threads at "
                    f"most {THREADS} and a multiple of the head's {hs4} vec4s")
        group = threads // hs4
        rows = self.queries * hs4 // threads
        if (self.keys % group or (self.queries // 4) % group or self.queries * hs4 % threads or not rows or hs4 % rows
                or self.keys * hs4 % threads):
            return f"backward tile {self}: its {threads} threads do not split head size {head_size}'s products evenly"
        if self.workgroup_bytes(head_size) > max_bytes:
            return f"backward tile {self}: head size {head_size} needs more than {max_bytes} bytes of workgroup memory"
        return ""

    def part_floats(self, batch: int, seq: int, n_head: int, head_size: int) -> int:
        """The dQ slices' size: per (batch, head), key block kb holds rows kb*KEYS..T-1."""
        blocks = -(-seq // self.keys)
        return batch * n_head * (blocks * seq - self.keys * (blocks * (blocks - 1) // 2)) * head_size

    def __str__(self) -> str:
        return f"{self.keys}x{self.queries}x{self.sn}"


# the tiled backward's tiles, fastest first, as timed on an H200 (experiments/attention_tiles.py, us a backward,
# its two dispatches back to back; the per-row kernels' in brackets): 32x32x2 (128 threads, 44.7 KB) 28.3
# lesson [49.9], 42.0 mid [64.8], 130.2 big [217.3], 9.8 at T = 32 [11.9], 14.1 at T = 64 [20.6]; 16x16x1
# 1.1-1.25x slower, 32x16x2, 16x8x1 and 32x32x4 slower still at head size 64; 32x32x4 is the one tile of
# these for head size 32: 43.1 [54.1]; 16x16x1 at head size 128: 260.1 [266.4].
BACKWARD_TILES = (BackwardTile(32, 32, 2), BackwardTile(16, 16, 1), BackwardTile(32, 32, 4))


def choose_backward_tile(head_size: int, max_bytes: int) -> BackwardTile | None:
    """The tiled backward's tile, or None for the per-row kernels."""
    return _choose(BACKWARD_TILE, BackwardTile, BACKWARD_TILES, "32x32x2 (keys, queries, keys a thread)", head_size,
                   max_bytes)


def backward_tiled_source(head_size: int, tile: BackwardTile) -> str:
    """attention_backward_tiled.wgsl for one head size and tile, its products' inner steps unrolled."""
    hs4, sn = head_size // 4, tile.sn
    counts = tile.counts(head_size)
    score_step = next(n for n in (2, 1) if hs4 % n == 0)
    kv_step = next(n for n in (2, 1) if (tile.queries // 4) % n == 0)
    q_step = next(n for n in (4, 2, 1) if tile.keys % n == 0)
    scores, kv, q = [], [], []
    pairs = [(i, j) for i in range(4) for j in range(sn)]  # S and dP's (query, key) per thread
    owned = [(o, i) for o in range(counts["$o"]) for i in range(4)]  # dK and dV's (key, query of the quad)
    quads = [(w, i) for w in range(counts["$u"]) for i in range(4)]  # dQ's (quad, query of the quad)
    for u in range(score_step):
        scores += [f"            let q{i}_{u} = q_tile[4u * sy + {i}u][d + {u}u];" for i in range(4)]
        scores += [f"            let k{j}_{u} = k_tile[sx + {j}u * SX][d + {u}u];" for j in range(sn)]
        scores += [f"            s_{i}_{j} = s_{i}_{j} + dot(q{i}_{u}, k{j}_{u});" for i, j in pairs]
        scores += [f"            let g{i}_{u} = g_tile[4u * sy + {i}u][d + {u}u];" for i in range(4)]
        scores += [f"            let v{j}_{u} = v_tile[sx + {j}u * SX][d + {u}u];" for j in range(sn)]
        scores += [f"            dp_{i}_{j} = dp_{i}_{j} + dot(g{i}_{u}, v{j}_{u});" for i, j in pairs]
    for u in range(kv_step):
        kv += [f"            let p{o}_{u} = p_tile[grp + {o}u * G][iq + {u}u];" for o in range(counts["$o"])]
        kv += [f"            let g{i}_{u} = g_tile[4u * (iq + {u}u) + {i}u][c];" for i in range(4)]
        kv += [f"            dv_{o} = dv_{o} + p{o}_{u}.{XYZW[i]} * g{i}_{u};" for o, i in owned]
        kv += [f"            let e{o}_{u} = ds_tile[grp + {o}u * G][iq + {u}u];" for o in range(counts["$o"])]
        kv += [f"            let q{i}_{u} = q_tile[4u * (iq + {u}u) + {i}u][c];" for i in range(4)]
        kv += [f"            dk_{o} = dk_{o} + e{o}_{u}.{XYZW[i]} * q{i}_{u};" for o, i in owned]
    for u in range(q_step):
        q += [f"            let k{u} = k_tile[j + {u}u][c];"]
        q += [f"            let e{w}_{u} = ds_tile[j + {u}u][grp + {w}u * G];" for w in range(counts["$u"])]
        q += [f"            dq_{w}_{i} = dq_{w}_{i} + e{w}_{u}.{XYZW[i]} * k{u};" for w, i in quads]
    text = kernel_source("attention_backward_tiled", {
        "HEAD": kernel_file("attention_head"), "HS4": hs4, "KEYS": tile.keys, "QUERIES": tile.queries, "SN": sn,
        "SCORE_STEP": score_step, "SCORES": "\n".join(scores), "KV_STEP": kv_step, "KV": "\n".join(kv),
        "Q_STEP": q_step, "Q": "\n".join(q)})
    return unroll(text, counts)


def _max(terms: list[str]) -> str:
    """WGSL's max of the terms, as a balanced tree."""
    if len(terms) == 1:
        return terms[0]
    half = len(terms) // 2
    return f"max({_max(terms[:half])}, {_max(terms[half:])})"


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
    text = kernel_source("attention", {"HEAD": kernel_file("attention_head"), "HS4": hs4, "ROWS": rows,
                                       "SPLITS": splits, "LANES": lanes, "LANE_SUM": lane_sum_body(lanes)})
    return unroll(text, {"$n": hs4 // lanes})


class Attention:
    """Compiles a kernel module per (head size, layout) on first use and records the dispatches."""

    def __init__(self, runtime):
        self.rt = runtime
        self.max_bytes = runtime.ctx.limits.get("max-compute-workgroup-storage-size", 16384)
        self.shaders = {}  # (head size, rows, splits, lanes) -> Shader
        self.tiled_shaders = {}  # (variable, head size, its setting) -> `_tiled_shader`'s answer

    def _shader(self, head_size: int):
        rows, splits = choose_layout(head_size, self.max_bytes)
        key = (head_size, rows, splits, lanes_for(head_size, self.rt.subgroups))
        if key not in self.shaders:
            self.shaders[key] = self.rt.shader(source(*key), f"attention hs{head_size} {rows}x{splits}x{key[3]}")
        return self.shaders[key], rows

    def _tiled_shader(self, head_size: int, backward: bool = False):
        """(Shader, tile) of the tiled forward or backward, (None, None) where no tile runs: chosen once per
        head size and setting of the variable that forces a tile (every eager call asks)."""
        variable = BACKWARD_TILE if backward else FORWARD_TILE
        key = (variable, head_size, os.environ.get(variable))
        found = self.tiled_shaders.get(key)
        if found is None:
            choose, source = (choose_backward_tile, backward_tiled_source) if backward else (choose_tile, tiled_source)
            tile = choose(head_size, self.max_bytes)
            label = f"attention {'backward' if backward else 'tiled'} hs{head_size} {tile}"
            found = self.tiled_shaders[key] = (None, None) if tile is None else \
                (self.rt.shader(source(head_size, tile), label), tile)
        return found

    def forward(self, qkv, y, lse, n_head: int, scale: float) -> None:
        batch, seq, c3 = qkv.shape
        shader, tile = self._tiled_shader(c3 // 3 // n_head)
        shader, rows = self._shader(c3 // 3 // n_head) if shader is None else (shader, tile.rows)
        rt, key = self.rt, ("attention_forward", shader, batch, seq, n_head, scale)
        launch = rt.launches.get(key) or rt.keep(key, rt.prepare(
            shader, "attention_forward_main", (batch * n_head, -(-seq // rows), 1), (0, 2, 4),
            {"seq": seq, "n_head": n_head, "scale": scale}))
        rt.launch(launch, (qkv, y, lse))

    def _backward_plan(self, qkv_shape: tuple, n_head: int):
        """(Shader, tile) of the tiled backward for this shape, (None, None) for the per-row kernels: also where
        the tile's dQ slices, which grow as T^2 / KEYS, would not fit one storage binding (the per-row
        kernels' delta grows as T; the slices, refused, would send the whole backward to NumPy)."""
        batch, seq, c3 = qkv_shape
        head_size = c3 // 3 // n_head
        shader, tile = self._tiled_shader(head_size, backward=True)
        if tile is not None and 4 * tile.part_floats(batch, seq, n_head, head_size) > self.rt.max_binding:
            return None, None
        return shader, tile

    def backward(self, g, qkv, y, lse, g_qkv, n_head: int, scale: float) -> None:
        """g_qkv from g, through a scratch array allocated before any dispatch (too large: TooLarge, and nothing
        recorded). Tiled: dK, dV and dQ's slices, then dQ. Per row: the dQ kernel saves delta = rowsum(g * y) in
        the scratch for the dK/dV kernel."""
        batch, seq, c3 = qkv.shape
        head_size = c3 // 3 // n_head
        params = {"seq": seq, "n_head": n_head, "scale": scale}
        shader, tile = self._backward_plan(qkv.shape, n_head)
        scratch = self.rt.empty((batch, n_head, seq) if tile is None else
                                (tile.part_floats(batch, seq, n_head, head_size),))
        if shader is not None:
            self.rt.dispatch(shader, "attention_backward_kv_main", (batch * n_head, -(-seq // tile.keys), 1),
                             {0: qkv, 1: g, 4: lse, 5: y, 6: scratch, 2: g_qkv}, params)
            self.rt.dispatch(shader, "attention_backward_q_main", (-(-seq * head_size // 4 // 256), batch * n_head, 1),
                             {6: scratch, 2: g_qkv}, params)
            return
        shader, rows = self._shader(head_size)
        grid = (-(-seq // rows), batch * n_head, 1)
        bindings = {0: qkv, 1: g, 4: lse, 6: scratch, 2: g_qkv}
        self.rt.dispatch(shader, "attention_backward_q_main", grid, {**bindings, 5: y}, params)
        self.rt.dispatch(shader, "attention_backward_kv_main", grid, bindings, params)
