"""Host cost of an eager evaluation forward, per dispatch, by what ran just before it: right after a read-back
(as `tinynn bench` times it), back to back with the forward before, and after states that each isolate one
thing a read-back does (the host idle, the GPU working while the host sleeps, the host's caches flushed).
Also the host thread's CPU time (is it waiting, or running slowly?) and the
bind groups each state made (a forward that makes some pays one-time work). One line per state.

    python experiments/eager_host_cost.py apps/bench/lesson.json [--forwards 20] [--batch B --block T]
    python experiments/eager_host_cost.py apps/bench/lesson.json --batch 1 --block 32 --recorded 30

--recorded R: only R rounds of 20 forwards recorded back to back (no read-back between them, nothing submitted
until the round's last), the minimum and median: the op layer's own cost with the least noise, which session 10's
A/B of two builds in alternating processes used (2-core machine: 7.7 us per dispatch before, 6.6-6.9 after).

Lavapipe, 2-core VM, lesson shapes at batch 1 x 16 tokens (33 dispatches): 18-20 us per dispatch after a
read-back, 10.5 back to back, 11 after sleeping 2 ms, 15 after a flush and 5 ms of sleep (the GPU's work,
run on the CPU here, evicts the host's caches), 17 after reading 32 MB. The thread's CPU time equals its
wall time in every state: the host is not waiting, it runs slower.

The H200 (session 14, two rounds each at the lesson shape and at 1 x 32 tokens, us per dispatch, median): after a
read-back 14.2-20.4, after a read-back whose wait spins (the host thread never sleeps) 13.8-18.8, back to back
15.3-18.5: there the host runs the op layer slowly whatever ran before, and keeping it awake changes nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from tinynn import config, registry
from tinynn.bench import lesson_step
from tinynn.tensor import Tensor, no_grad


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--forwards", type=int, default=20)
    parser.add_argument("--batch", type=int, help="the config's batch_size replaced")
    parser.add_argument("--block", type=int, help="the config's block_size replaced")
    parser.add_argument("--recorded", type=int, help="only this many rounds of 20 forwards recorded back to back")
    args = parser.parse_args()
    backend = registry.select("gpu")
    rt = backend.rt
    cfg = config.load(args.config)
    cfg = dataclasses.replace(cfg, batch_size=args.batch or cfg.batch_size, block_size=args.block or cfg.block_size)
    step, x = lesson_step(backend, cfg)
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
    def spun_read_back():
        """The read-back's wait spent polling without blocking: the host thread never sleeps."""
        loss = forward()
        rt.flush()
        calls = rt.native
        while not calls._lib.wgpuDevicePoll(calls._device, 0, calls.null):
            pass
        loss.item()
    states = {
        "after a read-back (bench)": lambda: forward().item(),
        "after a spun read-back": spun_read_back,
        "after a read-back, spinning 1 ms": lambda: (forward().item(), spin(0.001)),
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
        if args.recorded:
            times = []
            for _ in range(args.recorded):
                for _ in range(20):
                    t0 = time.perf_counter()
                    loss = forward()
                    times.append(time.perf_counter() - t0)
                loss.item()
            times = 1e6 * np.array(times) / per_forward
            print(f"  recorded back to back              us/dispatch min {times.min():5.2f} "
                  f"median {np.median(times):5.2f}")
            return
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
