"""How many workgroups of a blocked-matmul configuration an SM runs at once, and what each more brings: per
configuration, grids of 132 * j workgroups (11 j block-rows x 12 block-columns, K = 768, whole tiles, no
epilogue) for j = 1..8, timed back to back (`Runtime.time_pass`) after 2 s of load (0.5 s before each further
configuration). On a GPU of 132 SMs a grid of j workgroups an SM runs in one wave while j fit: its time then grows
less than j (more warps hide latency) or as j (the SM is busy); past what fits it steps up a wave at a time.

    python experiments/matmul_occupancy.py [--k 768] [--layouts nn,bt] [--waves 8]

The question (session 15): the autotune takes split-K on the big model's K = 768 products (128x64x16/8x8 split2
on 2048x2304x768), whose slices and finish cost memory traffic, which would only win if the unsplit grid left
the SMs short of workgroups, or in a partial last wave.

H200, session 15 (one call, 33 s; us per grid for j = 1..8, nn; bt within 2% but where noted):
  128x128x16/8x8 vec4 db unpadded  87.3 172.3 264.1 349.1 433.6 518.4 603.5 690.8  (bt 86.0 .. 672.7)
  128x128x16/8x8 vec4              99.3 201.9 334.3 437.3 536.7 643.7 741.9 838.4
  128x64x16/8x8                    61.5  95.1 133.1 221.1 223.7 267.4 344.0 347.5
  128x64x16/8x8 vec4 db            50.3  97.8 143.7 191.1 238.0 284.8 331.1 377.7  (bt 61.6 .. 534.3)
  128x96x16/8x8 vec4               97.0 131.8 269.6 281.1 407.4 422.9 539.6 562.4
  64x96x16/8x4 vec4 db             55.5  75.1 146.6 146.9 218.0 219.3 290.8 291.0
  64x64x16/8x4                     44.8  62.8  81.7 103.1 126.3 171.8 190.5 217.3
  64x64x16/8x4 vec4 db             40.9  58.8 112.9 114.5 167.8 171.2 229.8 241.3
The 256-thread 128x128 blocks grow exactly as j: an SM gains nothing from a second one (the db one runs at
37.7-38.6 TFLOP/s from the first wave on). The others step a wave at a time past 2 (64x96, 128x96, 64x64 vec4 db)
or 3 (128x64) resident workgroups, and each resident one adds work per microsecond up to there (1.4-1.8x j = 1's).
The best reach 37.4-38.6 TFLOP/s (128x128 db at every j, 128x64x16/8x8 at j = 3 and 8: 37.4, 38.2), the other six
27.5-35.4 at j = 8 (2 * 132 j * BM * BN * K flops over the times above): with enough workgroups the thread's inner
loop is the ceiling, not the warps an SM holds (session 5: a pure FMA loop reaches 69). 128x64 split2's 1152
workgroups on 2048x2304x768 fill 2.9 waves of 396 where unsplit 576 leave 1.45.
"""
import argparse
import time

import numpy as np

from tinynn import registry
from tinynn_gpu.matmul.blocked import BlockedMatmul
from tinynn_gpu.matmul.configs import BlockConfig as C

DB = dict(vec4=True, double=True)
CONFIGS = [C(128, 128, 16, 8, 8, **DB, pad=False), C(128, 128, 16, 8, 8, vec4=True), C(128, 64, 16, 8, 8),
           C(128, 64, 16, 8, 8, **DB), C(128, 96, 16, 8, 8, vec4=True), C(64, 96, 16, 8, 4, **DB),
           C(64, 64, 16, 8, 4), C(64, 64, 16, 8, 4, **DB)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=768)
    parser.add_argument("--layouts", default="nn,bt", help="nn: both operands as stored; bt: B transposed")
    parser.add_argument("--waves", type=int, default=8)
    args = parser.parse_args()
    gpu = registry.select("gpu")
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
                calls.append(lambda a=a, b=b, out=out, m=m, n=n: kernel.record(a, b, out, 1, m, n, k,
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
