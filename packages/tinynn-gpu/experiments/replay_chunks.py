"""How a replayed step is submitted, setting against setting: each setting's training step timed as `tinynn
bench` times it (a read-back every step), settings alternated in one process, with the caller's host time in
`Ahead.submit` per step.

    python packages/tinynn-gpu/experiments/replay_chunks.py apps/bench/lesson.json apps/bench/mid.json
        [--settings whole,16x2,16x2/16] [--rounds 2] [--steps 40]

Settings:
  whole    one command buffer between two writes of the step (session 8's replay)
  FxG      command buffers of F dispatches, then each G times the one before (replay.FIRST_CHUNK, CHUNK_GROWTH)
  FxG/L    also the step's last L dispatches in one of their own (LAST_CHUNK), and the read-back waiting for
           the earlier ones first (NativeCalls.read's `first`): today's replay with 16x2/16
"""
import argparse
import time

import numpy as np

from tinynn import backends, bench, config
from tinynn_gpu import native, replay


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--settings", default="whole,16x2,16x2/16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    gpu = backends.select("gpu")
    submits, early = [], [True]
    submit, read = replay.Ahead.submit, native.NativeCalls.read

    def timed_submit(ahead):
        t0 = time.perf_counter()
        try:
            return submit(ahead)
        finally:
            submits.append(time.perf_counter() - t0)

    def read_maybe_early(calls, buffer, parts, first=(), until=None):
        return read(calls, buffer, parts, first if early[0] else (), until)
    replay.Ahead.submit, native.NativeCalls.read = timed_submit, read_maybe_early
    for r in range(args.rounds):
        for path in args.configs:
            cfg = config.load(path)
            for setting in args.settings.split(","):
                chunks, _, last = setting.partition("/")
                first, growth = (1 << 30, 2) if chunks == "whole" else map(int, chunks.split("x"))
                replay.FIRST_CHUNK, replay.CHUNK_GROWTH, replay.LAST_CHUNK = first, growth, int(last or 0)
                early[0] = bool(last)
                submits.clear()
                t = bench.bench_train(gpu, cfg, args.steps)  # a new step, so a new capture with these settings
                print(f"round {r} {path} {setting:8s}: {t['ms_per_step']:.3f} ms/step, host {t['host_ms_per_step']:.3f} "
                      f"ms, Ahead.submit {1e3 * np.median(submits[-args.steps:]):.3f} ms, "
                      f"{t['submissions_per_step']:.1f} submissions/step", flush=True)


if __name__ == "__main__":
    main()
