"""Where the NumPy backend's lesson training step spends its time: each backend op's own time (exclusive of the
ops it calls) over a few steps, the rest of the step (autograd, Python) as "outside ops", and optionally a
cProfile listing.

    python experiments/cpu_step_profile.py [--steps 3] [--cprofile]
    TINYNN_NUM_THREADS=1 taskset -c 0 python experiments/cpu_step_profile.py
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import functools
import pstats
import time

from tinynn import bench, registry
from tinynn import config
from tinynn.numpy_backend import NumpyBackend


def wrap_ops(totals, counts):
    """Time every public NumpyBackend method, exclusive of the backend methods it calls."""
    stack = []
    for name, fn in list(vars(NumpyBackend).items()):
        if name.startswith("_") or not callable(fn):
            continue

        def timed(*args, __fn=fn, __name=name, **kwargs):
            stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return __fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                inner = stack.pop()
                totals[__name] += spent - inner
                counts[__name] += 1
                if stack:
                    stack[-1] += spent
        setattr(NumpyBackend, name, functools.wraps(fn)(timed))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--config", default="apps/bench/lesson.json")
    p.add_argument("--cprofile", action="store_true")
    args = p.parse_args()
    cfg = config.load(args.config)
    backend = registry.select("cpu")
    step, x = bench.lesson_step(backend, cfg)
    step(x, x, 3e-4).item()
    step(x, x, 3e-4).item()
    totals, counts = collections.Counter(), collections.Counter()
    wrap_ops(totals, counts)
    prof = cProfile.Profile() if args.cprofile else None
    t0 = time.perf_counter()
    for _ in range(args.steps):
        if prof:
            prof.enable()
        step(x, x, 3e-4).item()
        if prof:
            prof.disable()
    wall = (time.perf_counter() - t0) / args.steps * 1e3
    print(f"{wall:.1f} ms per step (timers on)")
    for name, seconds in totals.most_common():
        print(f"  {name:<34} {seconds / args.steps * 1e3:8.2f} ms  {counts[name] / args.steps:5.0f} calls")
    print(f"  {'outside ops':<34} {wall - sum(totals.values()) / args.steps * 1e3:8.2f} ms")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
