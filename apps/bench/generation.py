"""Generation throughput: tokens/s of a randomly initialised lesson-sized GPT (4 layers, 256 wide, block 128,
vocabulary 96) by device, batch and length, after a warm-up that compiles and autotunes every step kind.

A run of 117 new tokens after an 11-token prompt stays inside the window (every step a cached decode step);
500 tokens slide past block_size, where each token reruns the whole window (positions are learned).
`stream` reads the ids back as they come (in bursts), `generate` once at the end. A model restarts its last
decoder for a call with the same batch and sampling, so its recorded steps replay from the first token;
"first call" lines give each call a seed of its own, so each pays the eager warm-up steps and the recording
(what a one-shot `tinynn generate` pays).

`--profile` looks at one cached decode step instead, at batch 1 and 16: its dispatches, the host's time to
issue it (a replay), the wall time per step over back-to-back steps (the larger of host and GPU, since nothing
is read back), and each kernel's GPU time from timestamps (each dispatch then runs in a pass of its own,
which adds a few microseconds to each).

    python apps/bench/generation.py [gpu] [cpu] [--profile]
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import tinynn
from tinynn import registry
from tinynn import generate as generation
from tinynn.model import GPT, GPTConfig

LESSON = GPTConfig(vocab_size=96, block_size=128, n_layer=4, n_head=4, n_embd=256)
PROMPT = np.arange(1, 12)  # 11 tokens, as long as "Return the "


SAMPLING = {"temperature": 0.8, "top_k": 20, "seed": 1}
FIRST = "first call"


def tokens_per_s(model, batch: int, new: int, mode: str, cache=True, first=False, reps=3) -> float:
    """The median over reps of batch * new / seconds; `first`: a new seed each rep, so no recording is reused."""
    prompt = np.repeat(PROMPT[None, :], batch, 0)
    rates = []
    for rep in range(reps):
        sampling = {**SAMPLING, "seed": 1000 + rep} if first else SAMPLING
        t0 = time.perf_counter()
        if mode == "stream":
            for _ in model.stream(prompt, new, use_cache=cache, **sampling):
                pass
        else:
            model.generate(prompt, new, use_cache=cache, **sampling)
        rates.append(batch * new / (time.perf_counter() - t0))
    return statistics.median(rates)


def run(device: str, cases) -> None:
    backend = registry.select(device)
    tinynn.manual_seed(0)
    model = GPT(LESSON).to(backend)
    for batch in sorted({c[0] for c in cases}):
        model.generate(np.repeat(PROMPT[None, :], batch, 0), 140, **SAMPLING)  # every step kind compiled and tuned
    for batch, new, mode, *flags in cases:
        cache = "--no-cache" not in flags
        rate = tokens_per_s(model, batch, new, mode, cache, FIRST in flags, reps=1 if new > 200 or not cache else 3)
        print(f"{device} ({backend.device_name[:24]}) batch {batch:>2}, {new} new tokens, {mode:<8}"
              f"{''.join(f' {f}' for f in flags)}: {rate:>9,.0f} tokens/s", flush=True)


def profile_decode_step(device: str, batch: int) -> None:
    steps = LESSON.block_size - len(PROMPT) - 12  # every timed and profiled step inside the window: decode steps
    backend = registry.select(device)
    tinynn.manual_seed(0)
    model = GPT(LESSON).to(backend)
    decoder = generation.Decoder(model, np.repeat(PROMPT[None, :], batch, 0), **SAMPLING)
    for _ in range(8):  # prefill, the eager calls and the recording
        decoder.step()
    dispatches = backend.counters["dispatches"]
    decoder.step()
    dispatches = backend.counters["dispatches"] - dispatches
    backend.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        decoder.step()
    host = time.perf_counter() - t0
    backend.sync()
    wall = time.perf_counter() - t0
    print(f"{device} batch {batch:>2}: a decode step is {dispatches} dispatches; host {host / steps * 1e6:.0f} us "
          f"per step, wall {wall / steps * 1e6:.0f} us per step ({batch * steps / wall:,.0f} tokens/s)")
    if backend.is_gpu and "timestamp-query" in backend.ctx.features:
        rows = backend.profile(lambda: [decoder._inferring(decoder._decode_step) for _ in range(3)])  # eager
        print(f"  GPU time per step, {sum(r['ms'] for r in rows) / 3 * 1e3:.0f} us in all:")
        for r in rows:
            print(f"    {r['kernel']:<40} {r['calls'] // 3:>3} x {r['ms'] / r['calls'] * 1e3:6.1f} us")


def main() -> None:
    devices = [a for a in sys.argv[1:] if a != "--profile"] or ["gpu", "cpu"]
    if "--profile" in sys.argv:
        for device in devices:
            for batch in (1, 16):
                profile_decode_step(device, batch)
        return
    if "gpu" in devices:
        run("gpu", [(1, 117, "stream"), (1, 117, "stream", FIRST), (1, 117, "generate"), (1, 500, "stream"),
                    (16, 117, "generate"), (16, 117, "generate", FIRST), (16, 500, "generate"),
                    (1, 500, "stream", "--no-cache")])
    if "cpu" in devices:
        run("cpu", [(1, 117, "stream"), (1, 500, "stream"), (16, 117, "generate")])


if __name__ == "__main__":
    main()
