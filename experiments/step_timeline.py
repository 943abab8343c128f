"""Where a synced replayed step's host time goes, and what a submission and wgpu's clean-up cost.

    python experiments/step_timeline.py apps/bench/lesson.json [apps/bench/mid.json] [--steps 40]

1. A timeline of the step as `tinynn bench` runs it (`train_step(x, y, lr).item()`): marks around the step call,
   its input writes, the optimizer's per-step values, the captured step (from its start to the replay's: the guard
   key), the replay, its queue write and submissions, the recording ahead (on the worker thread) and the
   read-back; us from the call's start, medians over steps.
   Between the read-back's return and the first submission's end the GPU has nothing to run.
2. Fixed costs: the submission of an empty command buffer, a 16 KB queue write before it, an idle 4-byte
   read-back; and a non-blocking device poll with nothing finished against one after a step the GPU has
   finished (the host slept meanwhile): the second is wgpu's clean-up after the step's command buffers, which
   runs inside whichever poll first finds them done.

H200, session 9 (a prototype of this script, on a build whose replay's first command buffer held 8 dispatches,
without the read-back's early waits; lesson / mid): the input writes, optimizer values and guard key took
101 / 100 us of Python, the replay's queue write 33 / 30, its first submission 60 / 54 us; an empty
submission 28 us, with a 16 KB write 37, an idle read-back 99 us; a poll 1 us idle, 158 / 153 us after a
finished step.
"""
import argparse
import collections
import time
from concurrent.futures import Future

import numpy as np

from tinynn import bench, config, registry
from tinynn.optim import Optimizer
from tinynn.train import TrainStep
from tinynn_gpu.runtime import capture, native, replay, runtime
from tinynn_gpu.backend import WgpuBackend

MARKED = ((TrainStep, "__call__", "step"), (WgpuBackend, "write_", "write_"), (Optimizer, "prepare_step", "prepare_step"),
          (capture.CapturedStep, "__call__", "captured"),
          (replay.Replaying, "replay", "replay"), (Future, "result", "ahead.result"),
          (runtime.Runtime, "_upload_staged", "upload_staged"), (replay.Ahead, "submit", "ahead.submit"),
          (native.NativeCalls, "submit", "queue.submit"), (replay.Ahead, "__init__", "ahead.record (worker)"),
          (runtime.Runtime, "read", "rt.read"), (runtime.Runtime, "flush", "flush"),
          (native.NativeCalls, "read", "map+wait"))


def mark_calls(marks: list):
    """Wrap each MARKED method so that its start and end append (label, time) to marks; returns an undo."""
    originals = []
    for cls, attr, label in MARKED:
        original = getattr(cls, attr)
        originals.append((cls, attr, original))

        def marked(*args, _original=original, _label=label, **kwargs):
            marks.append((_label + " >", time.perf_counter()))
            try:
                return _original(*args, **kwargs)
            finally:
                marks.append((_label + " <", time.perf_counter()))
        setattr(cls, attr, marked)
    return lambda: [setattr(cls, attr, original) for cls, attr, original in originals]


def timeline(gpu, cfg, steps):
    step, x = bench.lesson_step(gpu, cfg)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < bench.GPU_WARMUP_SECONDS:  # autotune, capture, clocks
        step(x, x, 3e-4).item()
    marks, rows, totals = [], collections.defaultdict(list), []
    undo = mark_calls(marks)
    try:
        for _ in range(steps):
            marks.clear()
            start = time.perf_counter()
            step(x, x, 3e-4).item()
            totals.append(time.perf_counter() - start)
            seen = collections.Counter()
            for label, at in marks:
                seen[label] += 1
                rows[f"{label} #{seen[label]}"].append(1e6 * (at - start))
    finally:
        undo()
    print(f"   {1e3 * np.median(totals):.3f} ms per synced step; us from the step call's start (medians):")
    for label, times in sorted(rows.items(), key=lambda row: np.median(row[1])):
        print(f"   {np.median(times):9.1f}  {label}")
    return step, x, np.median(totals)


def fixed_costs(gpu, step, x, step_seconds):
    rt, calls = gpu.rt, gpu.rt.native
    lib, device = calls._lib, calls._device

    def poll():
        t0 = time.perf_counter()
        lib.wgpuDevicePoll(device, 0, calls.null)
        return time.perf_counter() - t0
    target, data = rt.empty((4096,), np.float32), np.zeros(4096, np.float32)

    def submit(write):
        if write:
            calls.write(target.buffer._internal, data)
        encoder, compute_pass = calls.begin()
        calls.submit([calls.finish(encoder, compute_pass)])
    costs = collections.defaultdict(list)
    for _ in range(40):
        for label, run in (("empty submission", lambda: submit(False)), ("16 KB write + submission", lambda: submit(True)),
                           ("idle 4-byte read-back", rt.sync)):
            rt.sync()
            t0 = time.perf_counter()
            run()
            costs[label].append(time.perf_counter() - t0)
        costs["poll, nothing finished"].append(poll())
    for _ in range(20):
        loss = step(x, x, 3e-4)
        time.sleep(2 * step_seconds)  # the GPU is surely done
        costs["poll after a finished step"].append(poll())
        loss.item()
    for label, times in costs.items():
        print(f"   {label}: {1e6 * np.median(times):.1f} us (median)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    gpu = registry.select("gpu")
    if gpu.rt.native is None:
        raise SystemExit(f"needs the direct calls: {gpu.rt.native_reason}")
    for path in args.configs:
        print(f"== {path}")
        step, x, seconds = timeline(gpu, config.load(path), args.steps)
        fixed_costs(gpu, step, x, seconds)


if __name__ == "__main__":
    main()
