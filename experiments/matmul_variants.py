"""Matmul variants side by side: each checked against NumPy on the same operands, then timed with GPU
timestamps. This is where BLOCK_CONFIGS and MatmulSelector.default_variant come from (BENCHMARKS.md).

    python experiments/matmul_variants.py --sizes 512,1024,2048,4096 [--extra] [--json F]

--extra adds configurations beyond the shipped candidate list, to look for better ones.
"""
import argparse
import json

import numpy as np

from tinynn import registry
from tinynn_gpu.matmul.configs import BLOCK_CONFIGS, BlockConfig
from tinynn_gpu.matmul.selection import MatmulSelector

EXTRA = (BlockConfig(128, 128, 8, 8, 8, group=16), BlockConfig(128, 128, 16, 8, 8, group=4),
         BlockConfig(128, 64, 16, 8, 4), BlockConfig(64, 64, 16, 8, 8), BlockConfig(128, 128, 32, 8, 8),
         BlockConfig(256, 64, 8, 16, 4), BlockConfig(64, 256, 8, 4, 16))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="512,1024,2048,4096")
    parser.add_argument("--extra", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    gpu = registry.select("gpu")
    selector = MatmulSelector(gpu.rt, autotune=False)
    if args.extra:
        selector.variants.update({f"blocked {c.name} g{c.group}": c for c in EXTRA})
    print(f"{gpu.device_name}: {len(selector.variants)} variants (shipped candidates: {len(BLOCK_CONFIGS) + 3})")
    results = []
    for n in [int(s) for s in args.sizes.split(",")]:
        g = np.random.default_rng(n)
        a, b = g.standard_normal((n, n), dtype=np.float32), g.standard_normal((n, n), dtype=np.float32)
        expected = a.astype(np.float64) @ b
        da, db, out = gpu.from_numpy(a), gpu.from_numpy(b), gpu.rt.empty((n, n))
        call = (da, db, out, 1, n, n, n, False, False, False)
        for name in list(selector.variants):
            if not selector._fits(name):
                continue
            selector.variant(name).record(*call)
            got = gpu.to_numpy(out)
            err = float(np.linalg.norm(got - expected) / np.linalg.norm(expected))
            ms = selector.time_variants(call, [name], reps=5)[name]
            row = {"size": n, "variant": name, "ms": ms, "tflops": 2 * n**3 / ms / 1e9, "rel_err": err,
                   "ok": err <= 1e-5}
            results.append(row)
            print(f"{n:5d}  {name:<32} {ms:9.3f} ms  {row['tflops']:7.2f} TFLOP/s  rel err {err:.1e}"
                  f"{'' if row['ok'] else '  WRONG'}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
