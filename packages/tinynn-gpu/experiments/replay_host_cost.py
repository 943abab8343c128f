"""Host cost of replaying the captured lesson step, per dispatch: wgpu-py's methods against direct
wgpu-native calls, several submission chunk sizes, and finish + submit handed to a second thread (cffi
releases the GIL in native calls, so they could overlap the next chunk's recording). Also the cost of one
`queue.write_buffer` of a step's token ids. Prints one JSON object.

    python packages/tinynn-gpu/experiments/replay_host_cost.py [--config apps/bench/lesson.json] [--steps 50]

How REPLAY_CHUNK (runtime.py) was chosen: the chunk with the lowest ms_per_step here on the H200 (32). The
threaded submit was not adopted: on the H200 its steps were within noise of the inline ones (5.58 against
5.67 ms at 32, 5.65 against 5.77 at 64), since at 7 us of host per dispatch the lesson step already waits
on the GPU.
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
from tinynn_gpu import runtime


def timed_steps(be, train_step, x, steps, replay=None):
    """(ms per step, host ms per step): the step as `train_step` runs it, or with `replay(rt, tape)`."""
    run = train_step._run
    if replay is not None:
        def call():
            train_step.backend.write_(train_step.x.data, x)
            train_step.backend.write_(train_step.y.data, x)
            train_step.optimizer.prepare_step()
            replay(be.rt, run.tape)
            return be.rt.copy(run.result)
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
    """A replay whose end + finish + submit of each chunk runs on a worker thread, in order."""
    jobs = queue.Queue()

    def worker():
        while True:
            job = jobs.get()
            if job is None:
                return
            compute_pass, encoder, q = job
            compute_pass.end()
            q.submit([encoder.finish()])
            jobs.task_done()
    threading.Thread(target=worker, daemon=True).start()

    def replay(rt, tape):
        direct = rt.native is not None
        program = tape.programs.get(direct) or tape.programs.setdefault(direct, runtime._compile(tape.events, direct))
        record = rt._replay_native if direct else rt._replay_methods
        rt.flush()
        for kind, runs, _ in program:
            assert kind == "dispatches"
            encoder = rt.device.create_command_encoder()
            compute_pass = encoder.begin_compute_pass()
            record(compute_pass, runs)
            jobs.put((compute_pass, encoder, rt.queue))
        jobs.join()
    return replay


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--steps", type=int, default=50)
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
    plain_chunk = runtime.REPLAY_CHUNK
    for path, native_calls in (("direct", calls), ("methods", None)):
        if path == "direct" and calls is None:
            continue
        rt.use_native(native_calls, "experiment")
        for chunk in (16, 32, 48, 64, 96, 128, 100000):
            runtime.REPLAY_CHUNK = chunk
            tape.programs.clear()
            for name, replay in (("inline", None), ("threaded submit", threaded_replay())):
                ms, host = timed_steps(be, train_step, x, args.steps, replay)
                out["rows"].append({"path": path, "chunk": chunk, "submit": name, "ms_per_step": ms,
                                    "host_ms_per_step": host, "host_us_per_dispatch": 1e3 * host / tape.dispatches})
    runtime.REPLAY_CHUNK = plain_chunk
    tape.programs.clear()
    rt.use_native(calls, rt.native_reason)
    ids = np.zeros((cfg.batch_size, cfg.block_size), np.int32).tobytes()
    target = train_step.x.data.buffer
    rt.flush()
    t0 = time.perf_counter()
    for _ in range(1000):
        rt.queue.write_buffer(target, 0, ids)
    out["write_buffer_us"] = (time.perf_counter() - t0) * 1e3
    be.sync()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
