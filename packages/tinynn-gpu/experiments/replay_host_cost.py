"""Host cost of replaying the captured lesson step, per dispatch: wgpu-py's methods against direct
wgpu-native calls, several submission schedules (a first chunk of FIRST_CHUNK dispatches, each next one
CHUNK_GROWTH times longer), and the end + finish + submit of each chunk handed to a second thread (cffi
releases the GIL in native calls, so they could overlap the next chunk's recording). Also the cost of one
`queue.write_buffer` of a step's token ids. Prints one JSON object.

    python packages/tinynn-gpu/experiments/replay_host_cost.py [--config apps/bench/lesson.json] [--steps 30]

How the schedule in replay.py was chosen: fixed chunks first (H200, lesson step, direct calls, ms per
step: 16 gave 5.80, 32 5.67, 64 5.77, 128 6.33, one submission 6.73), then growing ones, which keep the
first submission as early while paying the host's fixed price per submission fewer times.
"""
from __future__ import annotations

import argparse
import json
import queue
import threading
import time

import numpy as np

from tinynn import backends, config
from tinynn.bench import LESSON, lesson_step
from tinynn.config import TrainConfig
from tinynn_gpu import replay as schedule


def timed_steps(be, train_step, x, steps, replay=None):
    """(ms per step, host ms per step): the step as `train_step` runs it, or with `replay(rt, tape, result)`."""
    run = train_step._run
    if replay is not None:
        def call():
            train_step.backend.write_(train_step.inputs[0][0].data, x)
            train_step.backend.write_(train_step.inputs[0][1].data, x)
            train_step.optimizer.prepare_step()
            return replay(be.rt, run.tape, run.result)
    else:
        def call():
            return train_step(x, x, 3e-4).data
    for _ in range(5):
        be.to_numpy(call())
    host, t0 = 0.0, time.perf_counter()
    for _ in range(steps):
        t1 = time.perf_counter()
        loss = call()
        host += time.perf_counter() - t1
        be.to_numpy(loss)
    return 1e3 * (time.perf_counter() - t0) / steps, 1e3 * host / steps


def threaded_replay():
    """A direct-call replay whose end + finish + submit of each chunk runs on a worker thread, in order; the
    replay returns once the worker has submitted everything (so host time counts all of it)."""
    jobs, errors = queue.Queue(), []

    def worker():
        while True:
            job = jobs.get()
            try:
                job[0].submit(*job[1:])
            except Exception as e:
                errors.append(e)
            jobs.task_done()
    threading.Thread(target=worker, daemon=True).start()

    def replay(rt, tape, result):
        calls = rt.native
        program = tape.programs.get(True) or tape.programs.setdefault(True, schedule.compile_program(tape.events, True))
        rt.flush()
        out = rt.empty(result.shape, result.dtype)
        copies = [(result.buffer._internal, 0, out.buffer._internal, 0, max(4, result.nbytes))]
        for i, (kind, item) in enumerate(program):
            if kind == "write":
                jobs.join()
                calls.write(*item)
                continue
            encoder, compute_pass = calls.begin()
            calls.record(compute_pass, item)
            jobs.put((calls, encoder, compute_pass, copies if i == len(program) - 1 else ()))
        jobs.join()
        assert not errors, errors
        return out
    return replay


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    cfg = config.load(args.config) if args.config else TrainConfig(**LESSON)
    be = backends.select("gpu")
    train_step, x = lesson_step(be, cfg)
    for _ in range(6):
        train_step(x, x, 3e-4).item()
    tape = train_step._run.tape
    assert tape is not None, train_step._run.eager_reason
    rt, calls = be.rt, be.rt.native
    out = {"device": be.device_name, "dispatches": tape.dispatches, "recording": rt.describe()["recording"],
           "rows": []}
    plain = schedule.FIRST_CHUNK, schedule.CHUNK_GROWTH
    schedules = [(32, 1), (16, 2), (32, 2), (64, 2), (100000, 1)]
    for path, native_calls in (("direct", calls), ("methods", None)):
        if path == "direct" and calls is None:
            continue
        rt.use_native(native_calls, "experiment")
        for first, growth in schedules if path == "direct" else [plain]:
            schedule.FIRST_CHUNK, schedule.CHUNK_GROWTH = first, growth
            tape.programs.clear()
            variants = [("inline", plain_replay)] + ([("threaded submit", threaded_replay())] if native_calls else [])
            for name, replay in variants:
                ms, host = timed_steps(be, train_step, x, args.steps, replay)
                out["rows"].append({"path": path, "first": first, "growth": growth, "submit": name,
                                    "ms_per_step": round(ms, 3), "host_ms_per_step": round(host, 3),
                                    "host_us_per_dispatch": round(1e3 * host / tape.dispatches, 2)})
    schedule.FIRST_CHUNK, schedule.CHUNK_GROWTH = plain
    tape.programs.clear()
    rt.use_native(calls, rt.native_reason)
    ids = np.zeros((cfg.batch_size, cfg.block_size), np.int32)
    target = train_step.inputs[0][0].data
    rt.flush()
    t0 = time.perf_counter()
    for _ in range(1000):
        rt.write(target, ids)
    out["write_us"] = (time.perf_counter() - t0) * 1e3
    be.sync()
    print(json.dumps(out, indent=1))


def plain_replay(rt, tape, result):
    return rt.replay(tape, result)


if __name__ == "__main__":
    main()
