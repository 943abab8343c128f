"""Host cost of an eager evaluation forward, per dispatch, by what ran just before it: right after a read-back
(as `tinynn bench` times it), back to back with the forward before, and after states that each isolate one
thing a read-back does (the host idle, the GPU working while the host sleeps, the host's caches flushed).
Also the host thread's CPU time (is it waiting, or running slowly?) and the
bind groups each state made (a forward that makes some pays one-time work). One line per state.

    python packages/tinynn-gpu/experiments/eager_host_cost.py apps/bench/lesson.json [--forwards 20]

Lavapipe, 2-core VM, lesson shapes at batch 1 x 16 tokens (33 dispatches): 18-20 us per dispatch after a
read-back, 10.5 back to back, 11 after sleeping 2 ms, 15 after a flush and 5 ms of sleep (the GPU's work,
run on the CPU here, evicts the host's caches), 17 after reading 32 MB. The thread's CPU time equals its
wall time in every state: the host is not waiting, it runs slower.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from tinynn import backends, config
from tinynn.bench import lesson_step
from tinynn.tensor import Tensor, no_grad


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--forwards", type=int, default=20)
    args = parser.parse_args()
    backend = backends.select("gpu")
    rt = backend.rt
    step, x = lesson_step(backend, config.load(args.config))
    model = step.model
    inputs = [Tensor(backend.from_numpy(x), backend) for _ in range(2)]
    model.eval()
    junk = np.random.rand(4 << 20)  # 32 MB, more than the host's last-level cache

    def forward():
        return model(*inputs)[1]

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    states = {
        "after a read-back (bench)": lambda: forward().item(),
        "back to back": lambda: (forward().item(), forward()),
        "b2b, host asleep 2 ms": lambda: (forward().item(), forward(), time.sleep(0.002)),
        "b2b, host spinning 2 ms": lambda: (forward().item(), forward(), spin(0.002)),
        "b2b, submitted, asleep 5 ms": lambda: (forward().item(), forward(), rt.flush(), time.sleep(0.005)),
        "b2b, 32 MB read": lambda: (forward().item(), forward(), junk.sum()),
        "after a read-back, asleep 5 ms": lambda: (forward().item(), time.sleep(0.005)),
    }
    with no_grad():
        for _ in range(3):
            forward().item()
        before = rt.counters["dispatches"]
        forward().item()
        per_forward = rt.counters["dispatches"] - before
        print(f"{args.config}: {per_forward} dispatches per forward, {rt.describe()['recording']}")
        for name, before_each in states.items():
            wall, cpu, groups = [], [], rt.counters["bind_groups_created"]
            for _ in range(args.forwards):
                before_each()
                t0, c0 = time.perf_counter(), time.thread_time()
                loss = forward()
                wall.append(time.perf_counter() - t0)
                cpu.append(time.thread_time() - c0)
                loss.item()
                del loss  # each state's forwards start with the same arrays alive
            wall, cpu = 1e6 * np.array(wall) / per_forward, 1e6 * np.array(cpu) / per_forward
            print(f"  {name:34s} us/dispatch median {np.median(wall):5.1f} min {wall.min():5.1f} "
                  f"max {wall.max():5.1f} (thread CPU {np.median(cpu):5.1f}); "
                  f"bind groups made {rt.counters['bind_groups_created'] - groups}")


if __name__ == "__main__":
    main()
