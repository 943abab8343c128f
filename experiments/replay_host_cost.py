"""Host cost of replaying a captured training step, read back every step as a training loop (and PyTorch's
reference) does: the next step recorded ahead on the worker thread, recorded ahead before the call returns,
and through wgpu-py's methods (recorded at each call). Alternated `--rounds` times in one process. Per
path: ms per step, the caller's host ms per step (the call until it returns) and per dispatch, and the
recording thread's ms per step. Prints one JSON object.

    python experiments/replay_host_cost.py [--config apps/bench/lesson.json] [--steps 50]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from tinynn import config, registry
from tinynn.bench import GPU_WARMUP_SECONDS, LESSON, lesson_step
from tinynn.config import TrainConfig


def timed_steps(be, train_step, x, steps):
    """(ms per step, median host ms of the call)."""
    host, t0 = [], time.perf_counter()
    for _ in range(steps):
        t1 = time.perf_counter()
        loss = train_step(x, x, 3e-4)
        host.append(time.perf_counter() - t1)
        loss.item()
    return 1e3 * (time.perf_counter() - t0) / steps, 1e3 * statistics.median(host)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cfg = config.load(args.config) if args.config else TrainConfig(**LESSON)
    be = registry.select("gpu")
    rt = be.rt
    calls, reason, threaded = rt.native, rt.native_reason, rt.record_thread is not None
    train_step, x = lesson_step(be, cfg)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < GPU_WARMUP_SECONDS:
        train_step(x, x, 3e-4).item()
    tape = train_step._run.tape
    assert tape is not None, train_step._run.eager_reason
    paths = {"methods": (None, "experiment", False)}
    if calls is not None:
        paths = {"ahead on the worker thread": (calls, reason, True), "ahead inline": (calls, reason, False), **paths}
    rows = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, path in paths.items():
            rt.use_native(*path)
            timed_steps(be, train_step, x, 5)  # the path's first replay records its own step
            before = rt.counters["record_thread_us"]
            ms, host = timed_steps(be, train_step, x, args.steps)
            rows[name].append({"ms_per_step": round(ms, 3), "host_ms_per_step": round(host, 3),
                               "host_us_per_dispatch": round(1e3 * host / tape.dispatches, 2),
                               "record_thread_ms_per_step": round(
                                   (rt.counters["record_thread_us"] - before) / 1e3 / args.steps, 3)})
    rt.use_native(calls, reason, threaded)
    print(json.dumps({"device": be.device_name, "dispatches": tape.dispatches, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
