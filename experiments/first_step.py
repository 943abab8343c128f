"""How long a training loop on a new machine waits for its first step, and for its tuned matmul kernels: an empty
autotune cache (a TINYNN_CACHE_DIR of its own), a config's model and TrainStep as `tinynn bench` builds them,
seconds from the process's start to the first step's loss, to the end of the tuning, and the step's time after.
`--tune-first` tunes every shape at its first matmul, inside the first steps (the selector's `defer` off): the
way before tuning waited for the moments between steps.

    python experiments/first_step.py apps/bench/lesson.json [--tune-first] [--limit 600]

Prints one JSON line: seconds to the backend, to the first and second steps' losses, to the tuning's end (None
where nothing was left to tune after the first step) and the steps that took; the tuned step's milliseconds.
"""
from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402  (the clock starts before the imports: a user waits for them too)
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

os.environ["TINYNN_CACHE_DIR"] = tempfile.mkdtemp(prefix="tinynn-cold-")  # before the GPU package reads it

from tinynn import bench, config, registry  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--tune-first", action="store_true", help="tune inside the first steps (defer off)")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds to give the tuning at most")
    args = parser.parse_args()
    cfg = config.load(args.config)
    gpu = registry.select("gpu")
    at = {"backend_s": time.perf_counter() - START}
    train_step, x = bench.lesson_step(gpu, cfg)
    if args.tune_first:
        gpu.mm.defer = False

    def step():
        train_step(x, x, 3e-4).item()
        return time.perf_counter() - START
    at["first_step_s"] = step()
    print(f"first step's loss at {at['first_step_s']:.1f} s", file=sys.stderr, flush=True)
    at["second_step_s"] = step()
    steps = 2
    at["tuned_s"] = None
    while getattr(gpu, "tuning_pending", 0) and time.perf_counter() - START < args.limit:
        at["tuned_s"] = step()
        steps += 1
    at["steps_to_tuned"] = steps
    for _ in range(10):  # the recapture with the tuned kernels, and the clocks up
        step()
    t0, reps = time.perf_counter(), 30
    for _ in range(reps):
        step()
    at["tuned_step_ms"] = 1e3 * (time.perf_counter() - t0) / reps
    print(json.dumps({"config": args.config, "device": gpu.device_name, "tune_first": args.tune_first,
                      **{k: round(v, 3) if isinstance(v, float) else v for k, v in at.items()}}))


if __name__ == "__main__":
    main()
