"""Fused-attention layouts side by side: each (ROWS, SPLITS) of CANDIDATES that fits the adapter, with subgroup
lanes and with one thread a row, is checked against the float64 NumPy reference, then its forward and
backward kernels are timed with GPU timestamps, on the attention shapes of the benchmark configs
(apps/bench); then the tiled forward (attention_tiled.wgsl), checked and timed the same way, with each
(ROWS, KEYS, SN) of TILE_CANDIDATES that fits; then the backward: the per-row kernels (the default layout)
against the tiled backward (attention_backward_tiled.wgsl) with each (KEYS, QUERIES, SN) of
BACKWARD_CANDIDATES that fits, each timed per kernel and as its two dispatches back to back in one pass
(Runtime.time_pass, as in a step). This is where attention.LAYOUTS', attention.TILES' and
attention.BACKWARD_TILES' order comes from. An empty list skips a sweep; the GPU is kept busy ~2 s first
(an idle H200 clocks down to 345 MHz).

    python experiments/attention_tiles.py [--reps 20] [--json F] [--layouts ""] [--tiles ""]
"""
import argparse
import json
import os
import time

import numpy as np

from tinynn import backends, registry
from tinynn_gpu.ops.attention import lanes_for, workgroup_bytes
from tinynn_gpu.ops.attention_backward_tiled import BackwardTile
from tinynn_gpu.ops.attention_tiled import THREADS, Tile
from tinynn_gpu.runtime import settings

SHAPES = {"lesson": (16, 128, 4, 64), "mid": (16, 128, 6, 64), "big": (8, 256, 12, 64),
          "hs128": (8, 256, 6, 128), "hs32": (16, 128, 8, 32),
          "t32": (16, 32, 4, 64), "t64": (16, 64, 4, 64), "tiny": (2, 40, 2, 64),
          "gpt2": (4, 1024, 12, 64)}  # (B, T, n_head, head size); gpt2 only when asked for (--shapes gpt2)
CANDIDATES = ((16, 4), (16, 2), (16, 1), (8, 8), (8, 4), (32, 2), (32, 1), (64, 1))  # (rows, splits)
TILE_CANDIDATES = ((64, 32, 2), (64, 32, 4), (32, 32, 2), (32, 32, 4), (32, 64, 4), (32, 64, 2), (64, 16, 1),
                   (32, 32, 1), (64, 64, 4), (16, 32, 4), (16, 32, 2))  # (rows, keys, keys a thread)
BACKWARD_CANDIDATES = ((32, 32, 2), (32, 32, 4), (32, 16, 2), (16, 16, 1), (16, 8, 1))
  # (keys, queries, sn)


def rel_err(actual, expected):
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def case(gpu, ref, shape):
    """A random attention input and output gradient of shape (B, T, n_head, head size), both on the GPU, and the
    reference's float64 y, logsumexp and gradient."""
    batch, seq, n_head, hs = shape
    g = np.random.default_rng(0)
    qkv = g.standard_normal((batch, seq, 3 * n_head * hs)).astype(np.float32)
    grad = g.standard_normal((batch, seq, n_head * hs)).astype(np.float32)
    y_ref, lse_ref = ref.attention_forward(qkv.astype(np.float64), n_head, hs ** -0.5)
    g_ref = ref.attention_backward(grad.astype(np.float64), qkv.astype(np.float64), y_ref, lse_ref, n_head, hs ** -0.5)
    return gpu.from_numpy(qkv), gpu.from_numpy(grad), y_ref, lse_ref, g_ref


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--shapes", default=",".join(name for name in SHAPES if name != "gpt2"),
                        help="comma-separated names of SHAPES")
    parser.add_argument("--layouts", default=",".join(f"{r}x{s}" for r, s in CANDIDATES), help="e.g. 8x4,16x4")
    parser.add_argument("--paths", default="subgroup,workgroup", help="subgroup lanes, one thread a row, or both")
    parser.add_argument("--tiles", default=",".join("x".join(map(str, t)) for t in TILE_CANDIDATES),
                        help="e.g. 64x32x2")
    parser.add_argument("--backward-tiles", default=",".join("x".join(map(str, t)) for t in BACKWARD_CANDIDATES),
                        help="e.g. 32x32x2")
    parser.add_argument("--heat", type=float, default=2.0, help="seconds of GPU work before timing")
    args = parser.parse_args()
    gpu, ref = registry.select("gpu"), backends.reference()
    limit = gpu.attention.max_bytes
    print(f"{gpu.device_name}: {limit} bytes of workgroup memory")
    heat(gpu, args.heat)
    subgroups = gpu.rt.subgroups
    results = []
    for label in args.shapes.split(","):
        batch, seq, n_head, hs = SHAPES[label]
        scale = hs ** -0.5
        d_qkv, d_grad, y_ref, lse_ref, g_ref = case(gpu, ref, SHAPES[label])
        heat(gpu, args.heat / 2)  # computing the reference left the GPU idle
        layouts = [tuple(int(n) for n in layout.split("x")) for layout in args.layouts.split(",") if layout]
        paths = [{"subgroup": "1", "workgroup": "0"}[p] for p in args.paths.split(",")]
        force("TINYNN_ATTENTION_TILE", "0")  # the per-row forward
        force("TINYNN_ATTENTION_BACKWARD_TILE", "0")  # and backward
        for (rows, splits), path in ((layout, path) for path in paths for layout in layouts):
            lanes = lanes_for(hs, subgroups=path == "1")
            if workgroup_bytes(hs, rows, splits) > limit or rows * splits * lanes > THREADS:
                continue
            if path == "1" and "subgroup" not in gpu.ctx.features:
                continue
            force("TINYNN_ATTENTION_LAYOUT", f"{rows}x{splits}")
            gpu.rt.subgroups = path == "1"  # TINYNN_SUBGROUPS is read once, when the runtime starts
            y, lse = gpu.attention_forward(d_qkv, n_head, scale)
            g_qkv = gpu.attention_backward(d_grad, d_qkv, y, lse, n_head, scale)
            errs = [rel_err(gpu.to_numpy(y), y_ref), rel_err(gpu.to_numpy(lse), lse_ref),
                    rel_err(gpu.to_numpy(g_qkv), g_ref)]

            def run():
                for _ in range(args.reps):
                    y, lse = gpu.attention_forward(d_qkv, n_head, scale)
                    gpu.attention_backward(d_grad, d_qkv, y, lse, n_head, scale)
            times = {row["kernel"].split(".")[-1]: row["ms"] * 1e3 / args.reps for row in gpu.profile(run)}
            row = {"shape": label, "layout": f"{rows}x{splits}", "lanes": lanes, "us": times, "rel_err": errs,
                   "ok": max(errs) <= 2e-5}
            results.append(row)
            kernels = "  ".join(f"{k.replace('attention_', '').replace('_main', '')} {v:7.1f}"
                                for k, v in sorted(times.items()))
            print(f"{label:7s} {rows:3d}x{splits:<2d} lanes {lanes} us: {kernels}  total {sum(times.values()):7.1f}  "
                  f"err {max(errs):.1e}{'' if row['ok'] else '  WRONG'}", flush=True)
        force("TINYNN_ATTENTION_LAYOUT", None)
        force("TINYNN_ATTENTION_BACKWARD_TILE", None)
        gpu.rt.subgroups = subgroups  # the runtime's own choice for the tiled sweeps and the per-row backward
        for tile in (Tile(*(int(n) for n in t.split("x"))) for t in args.tiles.split(",") if t):
            if tile.check(hs, limit):
                continue
            force("TINYNN_ATTENTION_TILE", str(tile))
            y, lse = gpu.attention_forward(d_qkv, n_head, scale)
            errs = [rel_err(gpu.to_numpy(y), y_ref), rel_err(gpu.to_numpy(lse), lse_ref)]

            def run():
                for _ in range(args.reps):
                    gpu.attention_forward(d_qkv, n_head, scale)
            us = sum(row["ms"] for row in gpu.profile(run)) * 1e3 / args.reps
            results.append({"shape": label, "tile": str(tile), "us": {"forward": us}, "rel_err": errs,
                            "ok": max(errs) <= 2e-5})
            print(f"{label:7s} tiled {str(tile):8s} us: forward {us:7.1f}  err {max(errs):.1e}"
                  f"{'' if max(errs) <= 2e-5 else '  WRONG'}", flush=True)
        force("TINYNN_ATTENTION_TILE", None)
        tiles = ["0"] + [t for t in args.backward_tiles.split(",") if t]
        results += backward_rows(gpu, label, tiles, d_qkv, d_grad, g_ref, n_head, scale, args.reps, args.heat / 2)
    for name in ("TINYNN_ATTENTION_LAYOUT", "TINYNN_ATTENTION_TILE", "TINYNN_ATTENTION_BACKWARD_TILE"):
        force(name, None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def force(name: str, value: str | None) -> None:
    """Set a TINYNN_ variable (None: unset) and have the GPU package read it: its settings are read once
    (runtime/settings.py), so a variable set after the backend starts is otherwise ignored."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    settings.reload()


def heat(gpu, seconds):
    """Keep the GPU busy for `seconds`: its clocks rise from idle only under load."""
    a = gpu.from_numpy(np.ones((1024, 1024), np.float32))
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            gpu.matmul(a, a)
        gpu.rt.sync()


def backward_rows(gpu, label, tiles, d_qkv, d_grad, g_ref, n_head, scale, reps, heat_s):
    """The backward per tile ("0": the per-row kernels): error, us per kernel, us back to back; each timed
    after heat_s of GPU work (the float64 reference leaves the GPU idle long enough to clock down)."""
    _, _, c3 = d_qkv.shape
    hs = c3 // 3 // n_head
    y, lse = gpu.attention_forward(d_qkv, n_head, scale)
    rows = []
    for tile in tiles:
        if tile != "0" and BackwardTile(*(int(n) for n in tile.split("x"))).check(hs, gpu.attention.max_bytes):
            continue
        force("TINYNN_ATTENTION_BACKWARD_TILE", tile)
        err = rel_err(gpu.to_numpy(gpu.attention_backward(d_grad, d_qkv, y, lse, n_head, scale)), g_ref)

        def run():
            gpu.attention_backward(d_grad, d_qkv, y, lse, n_head, scale)
        run()
        heat(gpu, heat_s)
        times = {row["kernel"]: row["ms"] * 1e3 / reps for row in gpu.profile(lambda: [run() for _ in range(reps)])}
        passed = [gpu.rt.time_pass(run, reps) * 1e3 for _ in range(3)]
        rows.append({"shape": label, "backward_tile": tile, "us": times, "pass_us": passed, "rel_err": [err],
                     "ok": err <= 2e-5})
        kernels = "  ".join(f"{k.split('.')[-1].replace('attention_backward_', '').replace('_main', '')} {v:7.1f}"
                            for k, v in sorted(times.items()))
        print(f"{label:7s} backward {'per-row' if tile == '0' else tile:8s} us: {kernels}  back to back "
              f"{' / '.join(f'{p:.1f}' for p in passed)}  err {err:.1e}{'' if err <= 2e-5 else '  WRONG'}", flush=True)
    return rows


if __name__ == "__main__":
    main()
