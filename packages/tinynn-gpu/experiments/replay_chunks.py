"""The replay's command-buffer chunks (replay.FIRST_CHUNK, CHUNK_GROWTH) against whole-step command buffers:
each setting's training step timed as `tinynn bench` times it (a read-back every step), settings alternated in
one process, with the caller's host time in `Ahead.submit` per step.

    python packages/tinynn-gpu/experiments/replay_chunks.py apps/bench/lesson.json apps/bench/mid.json
        [--settings whole,8x2,16x2] [--rounds 2] [--steps 40]

A setting FxG: a first command buffer of F dispatches, each next one G times the one before; `whole`: one
command buffer between two writes of the step.
"""
import argparse
import time

import numpy as np

from tinynn import backends, bench, config
from tinynn_gpu import replay


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--settings", default="whole,8x2,16x2")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    gpu = backends.select("gpu")
    submits = []
    submit = replay.Ahead.submit

    def timed_submit(ahead):
        t0 = time.perf_counter()
        try:
            return submit(ahead)
        finally:
            submits.append(time.perf_counter() - t0)
    replay.Ahead.submit = timed_submit
    for r in range(args.rounds):
        for path in args.configs:
            cfg = config.load(path)
            for setting in args.settings.split(","):
                first, growth = (1 << 30, 2) if setting == "whole" else map(int, setting.split("x"))
                replay.FIRST_CHUNK, replay.CHUNK_GROWTH = first, growth
                submits.clear()
                t = bench.bench_train(gpu, cfg, args.steps)  # a new step, so a new capture with these chunks
                print(f"round {r} {path} {setting:6s}: {t['ms_per_step']:.3f} ms/step, host {t['host_ms_per_step']:.3f} "
                      f"ms, Ahead.submit {1e3 * np.median(submits[-args.steps:]):.3f} ms, "
                      f"{t['submissions_per_step']:.1f} submissions/step", flush=True)


if __name__ == "__main__":
    main()
