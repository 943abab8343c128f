"""How many workgroups of a blocked-matmul configuration an SM runs at once, and what each more brings: per
configuration, grids of 132 * j workgroups (11 j block-rows x 12 block-columns, K = 768, whole tiles, no
epilogue) for j = 1..8, timed back to back (`Runtime.time_pass`) after 2 s of load. On a GPU of 132 SMs a grid
of j workgroups an SM runs in one wave while j fit: its time then grows less than j (more warps hide latency)
or as j (the SM is busy); past what fits it steps up a wave at a time.

    python packages/tinynn-gpu/experiments/matmul_occupancy.py [--k 768] [--layouts nn,bt]

The question (session 15): the autotune takes split-K on the big model's K = 768 products (128x64x16/8x8 split2
on 2048x2304x768), whose slices and finish cost memory traffic, which would only win if the unsplit grid left
the SMs short of workgroups, or in a partial last wave.
"""
import argparse
import time

import numpy as np

from tinynn import backends
from tinynn_gpu.matmul_blocked import BlockConfig as C
from tinynn_gpu.matmul_blocked import BlockedMatmul

DB = dict(vec4=True, double=True)
CONFIGS = [C(128, 128, 16, 8, 8, **DB, pad=False), C(128, 128, 16, 8, 8, vec4=True), C(128, 64, 16, 8, 8),
           C(128, 64, 16, 8, 8, **DB), C(128, 96, 16, 8, 8, vec4=True), C(64, 96, 16, 8, 4, **DB),
           C(64, 64, 16, 8, 4), C(64, 64, 16, 8, 4, **DB)]
SMS = 132


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=768)
    parser.add_argument("--layouts", default="nn,bt", help="nn: both operands as stored; bt: B transposed")
    parser.add_argument("--waves", type=int, default=8)
    args = parser.parse_args()
    gpu = backends.select("gpu")
    rt = gpu.rt
    g = np.random.default_rng(0)
    k = args.k
    heated = False
    for layout in args.layouts.split(","):
        tb = layout == "bt"
        for config in CONFIGS:
            kernel = BlockedMatmul(rt, config)
            calls = []
            for j in range(1, args.waves + 1):
                m, n = 11 * j * config.bm, 12 * config.bn
                a = gpu.from_numpy(g.standard_normal((m, k), dtype=np.float32))
                b = gpu.from_numpy(g.standard_normal((n, k) if tb else (k, n), dtype=np.float32))
                out = rt.empty((m, n))
                calls.append(lambda a=a, b=b, out=out, m=m, n=n: kernel.record(a.buffer, b.buffer, out, 1, m, n, k,
                                                                                False, tb, True))
                calls[-1]()
            rt.sync()
            end = time.perf_counter() + (0.5 if heated else 2.0)
            while time.perf_counter() < end:
                for call in calls:
                    call()
                rt.sync()
            heated = True
            times = [min(rt.time_pass(call, 10) for _ in range(3)) * 1e3 for call in calls]
            steps = "  ".join(f"{j + 1}:{t:6.1f}" for j, t in enumerate(times))
            gains = " ".join(f"{(j + 1) * times[0] / t:4.2f}" for j, t in enumerate(times))
            print(f"{layout} {config.name:<34} us per grid {steps}\n{'':38}work per us over j=1's: {gains}",
                  flush=True)


if __name__ == "__main__":
    main()
