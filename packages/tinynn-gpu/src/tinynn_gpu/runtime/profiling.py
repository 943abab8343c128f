"""GPU time per kernel: `profile` runs a function with every dispatch in a compute pass of its own, timestamps at
its start and end; `time_pass` times a function's dispatches recorded back to back in one pass (autotuning)."""
from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
from tinynn_gpu.runtime.webgpu import wgpu

from tinynn_gpu.runtime.arrays import GpuArray

QUERY_CAPACITY = 4096  # WebGPU's most timestamps in one query set


class Profiler:
    def __init__(self, runtime):
        self.rt = runtime
        self.state = None  # while profiling: {"queries", "labels", "times", "calls"}

    def profile(self, fn) -> list[dict]:
        """Run fn() with every dispatch timed on the GPU; GPU time per kernel, largest first."""
        rt = self.rt
        if "timestamp-query" not in rt.ctx.features:
            raise RuntimeError(f"{rt.ctx.name} has no timestamp-query feature")
        if rt.tape is not None:
            rt.not_capturable("the step profiles itself")
            return []
        rt.flush()
        queries = rt.device.create_query_set(type="timestamp", count=QUERY_CAPACITY)
        self.state = {"queries": queries, "labels": [], "times": defaultdict(float), "calls": Counter()}
        try:
            fn()
            self._collect()
        finally:
            state, self.state = self.state, None
        rows = [{"kernel": k, "calls": state["calls"][k], "ms": t / 1e6} for k, t in state["times"].items()]
        return sorted(rows, key=lambda r: -r["ms"])

    def time_pass(self, fn, reps: int) -> float:
        """GPU milliseconds per call of fn() (which records dispatches), from `reps` calls recorded into one
        compute pass with timestamps at its start and end only: dispatches back to back with the barriers
        between them, as in a training step, without the per-dispatch passes and timestamps of `profile`
        (a few microseconds each, which would count against a kernel split into two dispatches)."""
        rt = self.rt
        if "timestamp-query" not in rt.ctx.features:
            raise RuntimeError(f"{rt.ctx.name} has no timestamp-query feature")
        if rt.tape is not None or self.state is not None:
            raise RuntimeError("time_pass cannot run inside a captured step or a profile")
        rt.flush()
        queries = rt.device.create_query_set(type="timestamp", count=2)
        rt.recording.begin_pass((queries, 0, 1))
        for _ in range(reps):
            fn()
        start, end = self._timestamps(queries, 2)
        return float(end - start) / 1e6 / reps

    def begin(self, label: str) -> None:
        """A pass of its own, timed, for the dispatch about to be recorded (`Runtime.launch`)."""
        if 2 * len(self.state["labels"]) + 2 > QUERY_CAPACITY:
            self._collect()
        self.rt.recording.end_pass()
        i = 2 * len(self.state["labels"])
        self.state["labels"].append(label)
        self.rt.recording.begin_pass((self.state["queries"], i, i + 1))

    def end(self) -> None:
        self.rt.recording.end_pass()

    def _collect(self) -> None:
        labels = self.state["labels"]
        if not labels:
            return
        stamps = self._timestamps(self.state["queries"], 2 * len(labels))
        for label, start, end in zip(labels, stamps[0::2], stamps[1::2]):
            self.state["times"][label] += float(end - start)
            self.state["calls"][label] += 1
        labels.clear()

    def _timestamps(self, queries, count: int) -> np.ndarray:
        """The first `count` timestamps of a query set, in nanoseconds, after the open pass ends (a read-back:
        the host waits for the GPU)."""
        resolved = self.rt.device.create_buffer(size=8 * count,
                                                usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self.rt.recording.resolve(queries, count, resolved)
        return self.rt.read(GpuArray(resolved, (count,), np.dtype(np.uint64)))
