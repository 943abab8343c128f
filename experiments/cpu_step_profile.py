"""Where the NumPy backend's lesson training step spends its time: each backend op's own time (exclusive of the
ops it calls) over a few steps, the rest of the step (autograd, Python) as "outside ops", optionally a cProfile
listing. `--times N` instead times N whole steps without timers, as wall and CPU time (the process's, all its
threads: on a machine shared with other jobs CPU time still compares two builds, and shows threads that spin);
`--torch` does that for PyTorch's step (apps/bench/torch_reference.py's model).

    python experiments/cpu_step_profile.py [--steps 3] [--cprofile]
    TINYNN_NUM_THREADS=1 taskset -c 0 python experiments/cpu_step_profile.py --times 6
    OMP_NUM_THREADS=1 taskset -c 0 python experiments/cpu_step_profile.py --times 6 --torch
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import functools
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wrap_ops(totals, counts):
    """Time every public NumpyBackend method, exclusive of the backend methods it calls."""
    from tinynn.numpy_backend import NumpyBackend
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


def print_ops(totals, counts, seconds, runs, unit="ms"):
    """wrap_ops' listing: each op's own time and calls per run (a step, a decode step), then the rest of the
    `seconds` the runs took as "outside ops"."""
    per = {"ms": 1e3, "us": 1e6}[unit] / runs
    for name, t in totals.most_common():
        print(f"  {name:<34} {t * per:8.2f} {unit}  {counts[name] / runs:5.1f} calls")
    print(f"  {'outside ops':<34} {(seconds - sum(totals.values())) * per:8.2f} {unit}")


def tinynn_step(config_path):
    from tinynn import bench, config, registry
    step, x = bench.lesson_step(registry.select("cpu"), config.load(config_path))
    return lambda: step(x, x, 3e-4).item()


def torch_step(config_path):
    sys.path.insert(0, str(ROOT / "apps" / "bench"))
    import torch_reference
    step = torch_reference.training_step(torch_reference.shape(Path(config_path).stem), "cpu")
    return lambda: step().item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--config", default=str(ROOT / "apps" / "bench" / "lesson.json"))
    p.add_argument("--cprofile", action="store_true")
    p.add_argument("--times", type=int, help="time this many steps, wall and CPU, without timers")
    p.add_argument("--torch", action="store_true", help="with --times: PyTorch's step")
    args = p.parse_args()
    step = (torch_step if args.torch else tinynn_step)(args.config)
    step()
    step()
    if args.times:
        wall, cpu = [], []
        for _ in range(args.times):
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        print(f"{'torch' if args.torch else 'tinynn'}: ms per step, wall min {min(wall) * 1e3:.0f} median "
              f"{statistics.median(wall) * 1e3:.0f}; CPU min {min(cpu) * 1e3:.0f} median {statistics.median(cpu) * 1e3:.0f}")
        return
    totals, counts = collections.Counter(), collections.Counter()
    wrap_ops(totals, counts)
    prof = cProfile.Profile() if args.cprofile else None
    t0 = time.perf_counter()
    for _ in range(args.steps):
        if prof:
            prof.enable()
        step()
        if prof:
            prof.disable()
    seconds = time.perf_counter() - t0
    print(f"{seconds / args.steps * 1e3:.1f} ms per step (timers on)")
    print_ops(totals, counts, seconds, args.steps)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
