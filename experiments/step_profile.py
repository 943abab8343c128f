"""A config's GPU training step: time per step and dispatches (as `tinynn bench` measures them, without its
CPU run), then GPU time per kernel of one eager step, every kernel listed.

    python experiments/step_profile.py apps/bench/lesson.json apps/bench/big.json [--steps 20]
"""
import argparse

from tinynn import bench, config, registry


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    gpu = registry.select("gpu")
    for path in args.configs:
        cfg = config.load(path)
        t = bench.bench_train(gpu, cfg, args.steps)
        print(f"== {path}: {t['ms_per_step']:.2f} ms/step ({t['host_ms_per_step']:.2f} ms host), "
              f"{t['dispatches_per_step']:.0f} dispatches, fallbacks {t['fallbacks']}", flush=True)
        rows = bench.profile_step(gpu, cfg)
        print(f"   GPU time of one eager step: {sum(r['ms'] for r in rows):.2f} ms in {sum(r['calls'] for r in rows)} "
              "dispatches")
        for r in rows:
            print(f"   {r['kernel']:<58} {r['calls']:4d} x {r['ms'] / r['calls'] * 1e3:8.1f} us = {r['ms']:7.3f} ms")
    print("matmul choices:", gpu.mm.choices)


if __name__ == "__main__":
    main()
