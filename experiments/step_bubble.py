"""How much of a training step is the GPU waiting for the host: a config's step timed as `tinynn bench` times
it (the loss read back after every step, like a logging loop) against the same steps read back only once
every `--every` steps (the GPU then has the next step queued while it works), and the round trip of a
4-byte read-back with nothing queued.

    python experiments/step_bubble.py apps/bench/lesson.json [--steps 40] [--every 10]
"""
import argparse
import statistics
import time

from tinynn import bench, config, registry


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gpu = registry.select("gpu")
    for path in args.configs:
        cfg = config.load(path)
        train_step, x = bench.lesson_step(gpu, cfg)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < bench.GPU_WARMUP_SECONDS:  # autotune, capture, clocks
            train_step(x, x, 3e-4).item()
        for r in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                train_step(x, x, 3e-4).item()
            synced = (time.perf_counter() - t0) / args.steps
            t0 = time.perf_counter()
            for i in range(args.steps):
                loss = train_step(x, x, 3e-4)
                if (i + 1) % args.every == 0:
                    loss.item()
            pipelined = (time.perf_counter() - t0) / args.steps
            trips = []
            for _ in range(20):
                t1 = time.perf_counter()
                gpu.sync()
                trips.append(time.perf_counter() - t1)
            print(f"{path} round {r}: {1e3 * synced:.3f} ms/step read back every step, {1e3 * pipelined:.3f} "
                  f"every {args.every} steps (bubble {1e3 * (synced - pipelined):.3f} ms); idle 4-byte read-back "
                  f"{1e6 * statistics.median(trips):.0f} us", flush=True)


if __name__ == "__main__":
    main()
