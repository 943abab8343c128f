"""The tiled attention backward (attention_backward_tiled.wgsl): dK, dV and dQ's per-key-block slices, then dQ
as the slices' sum, KEYS keys per workgroup, QUERIES queries per step (4 a thread), SN keys a thread, filled in and
unrolled per head size and tile. `choose_backward_tile` takes the first of BACKWARD_TILES that fits the head size
and the device; TINYNN_ATTENTION_BACKWARD_TILE=KEYSxQUERIESxSN forces one, =0 the per-row kernels (attention.py)."""
from __future__ import annotations

from typing import NamedTuple

from tinynn_gpu.ops.attention_tiled import THREADS, XYZW, choose
from tinynn_gpu.runtime import settings
from tinynn_gpu.runtime.wgsl import kernel_file, kernel_source, unroll

BACKWARD_TILE = "TINYNN_ATTENTION_BACKWARD_TILE"


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


# the tiled backward's tiles, fastest first (experiments/attention_tiles.py; BENCHMARKS.md, "Kernel tuning notes")
BACKWARD_TILES = (BackwardTile(32, 32, 2), BackwardTile(16, 16, 1), BackwardTile(32, 32, 4))


def choose_backward_tile(head_size: int, max_bytes: int) -> BackwardTile | None:
    """The tiled backward's tile, or None for the per-row kernels."""
    return choose(BACKWARD_TILE, settings.current().attention_backward_tile, BackwardTile, BACKWARD_TILES, head_size,
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
        "HEAD": kernel_file("attention_head"), "DQ": kernel_file("attention_dq"), "HS4": hs4, "KEYS": tile.keys,
        "QUERIES": tile.queries, "SN": sn, "SCORE_STEP": score_step, "SCORES": "\n".join(scores),
        "KV_STEP": kv_step, "KV": "\n".join(kv), "Q_STEP": q_step, "Q": "\n".join(q)})
    return unroll(text, counts)


