"""Where the NumPy backend's cached decode step (one new token of the lesson-sized GPT, apps/bench/generation.py's
model and sampling) spends its time: each backend op's own time per step (exclusive of the backend ops it calls),
the rest of the step (modules, Tensors, Python) as "outside ops", optionally a cProfile listing; `--times N`
instead times N rounds of 100 decode steps without timers (wall and the process's CPU time, all threads), the
median per step.

    TINYNN_NUM_THREADS=1 taskset -c 0 python experiments/cpu_decode_profile.py --batch 1 [--cprofile]
    TINYNN_NUM_THREADS=1 taskset -c 0 python experiments/cpu_decode_profile.py --batch 16 --times 5
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "apps" / "bench"))
sys.path.insert(0, str(ROOT / "experiments"))
STEPS = 100  # decode steps per round: the prompt (11) + 1 prefill + STEPS stay inside the window (128)


def decoder(batch: int):
    import generation as bench

    import tinynn
    from tinynn import generate, registry
    from tinynn.model import GPT
    tinynn.manual_seed(0)
    model = GPT(bench.LESSON).to(registry.select("cpu"))
    prompt = np.repeat(bench.PROMPT[None, :], batch, 0)
    d = generate.Decoder(model, prompt, **bench.SAMPLING)

    def round_(steps=STEPS, started=lambda: None):
        d.restart(prompt)
        d.step()  # the prefill
        started()
        t0 = time.perf_counter()
        for _ in range(steps):
            d.step()
        return time.perf_counter() - t0
    round_(20)  # warm-up
    return round_


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--cprofile", action="store_true")
    p.add_argument("--times", type=int, default=0, help="rounds of plain timing instead of the per-op listing")
    args = p.parse_args()
    if args.times:
        round_ = decoder(args.batch)
        walls, cpus = [], []
        for _ in range(args.times):
            c0 = time.process_time()
            walls.append(round_() / STEPS)
            cpus.append((time.process_time() - c0) / STEPS)
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        print(f"batch {args.batch}: decode step {wall * 1e6:.0f} us wall, {cpu * 1e6:.0f} us CPU (median of "
              f"{args.times} x {STEPS}); {args.batch / wall:,.0f} tokens/s")
        return
    from cpu_step_profile import print_ops, wrap_ops
    totals, counts = collections.Counter(), collections.Counter()
    wrap_ops(totals, counts)
    round_ = decoder(args.batch)
    profiler = cProfile.Profile() if args.cprofile else None

    def started():  # after the prefill: only decode steps counted
        totals.clear()
        counts.clear()
        if profiler:
            profiler.enable()
    wall = round_(started=started)
    if profiler:
        profiler.disable()
    print(f"batch {args.batch}: {wall / STEPS * 1e6:.0f} us per decode step (timers on)")
    print_ops(totals, counts, wall, STEPS, "us")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
