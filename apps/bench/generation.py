"""Generation throughput: tokens/s of a randomly initialised lesson-sized GPT (4 layers, 256 wide, block 128,
vocabulary 96) by device, batch and length, after a warm-up that compiles and autotunes every step kind.

A run of 117 new tokens after an 11-token prompt stays inside the window (every step a cached decode step);
500 tokens slide past block_size, where each token reruns the whole window (positions are learned).
`stream` reads the ids back as they come (in bursts), `generate` once at the end. A model restarts its last
decoder for a call with the same batch and sampling, so its recorded steps replay from the first token;
"first call" lines give each call a seed of its own, so each pays the eager warm-up steps and the recording
(what a one-shot `tinynn generate` pays).

    python apps/bench/generation.py [gpu] [cpu]
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import tinynn
from tinynn import backends
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
    backend = backends.select(device)
    tinynn.manual_seed(0)
    model = GPT(LESSON).to(backend)
    for batch in sorted({c[0] for c in cases}):
        model.generate(np.repeat(PROMPT[None, :], batch, 0), 140, **SAMPLING)  # every step kind compiled and tuned
    for batch, new, mode, *flags in cases:
        cache = "--no-cache" not in flags
        rate = tokens_per_s(model, batch, new, mode, cache, FIRST in flags, reps=1 if new > 200 or not cache else 3)
        print(f"{device} ({backend.device_name[:24]}) batch {batch:>2}, {new} new tokens, {mode:<8}"
              f"{''.join(f' {f}' for f in flags)}: {rate:>9,.0f} tokens/s", flush=True)


def main() -> None:
    devices = sys.argv[1:] or ["gpu", "cpu"]
    if "gpu" in devices:
        run("gpu", [(1, 117, "stream"), (1, 117, "stream", FIRST), (1, 117, "generate"), (1, 500, "stream"),
                    (16, 117, "generate"), (16, 117, "generate", FIRST), (16, 500, "generate"),
                    (1, 500, "stream", "--no-cache")])
    if "cpu" in devices:
        run("cpu", [(1, 117, "stream"), (1, 500, "stream"), (16, 117, "generate")])


if __name__ == "__main__":
    main()
