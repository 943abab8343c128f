"""What each kind of kernel costs inside the replayed training step, where its neighbours overlap it and no timing
pass surrounds it: the step timed as `tinynn bench` times it (the loss read back after each step), then again with
one kind's dispatches left out of the captured tape, each kind in turn. The difference is that kind's share of the
step. The numbers the step computes without them are wrong (NaN, stale); the timing is not: fp32 arithmetic runs at
one speed whatever the values.

    python experiments/step_knockout.py apps/bench/big.json [--steps 30] [--rounds 2]

A kind is a pipeline's label (module, then entry point) matched by one of KINDS' patterns; `--list` prints every
label of the step with its count.

H200, session 19 (d5fe7a6, session 18's autotune cache; two rounds, 30 steps at big, 60 at lesson and mid), ms of the
step (full step 33.54 / 33.41, 2.29 / 2.28, 5.46 / 5.44 ms) and dispatches:
  big:    matmuls (98) 28.59 / 28.49; split-K finishes (110, with the norm's: 111) 1.68 / 1.65; attention backward
          kv (12) 1.74 / 1.60, its dQ sums (12) 0.27 / 0.13; attention forward (12) 0.83 / 0.70; AdamW (3) 0.81 /
          0.68; LayerNorm backward (25) 0.67 / 0.52, forward (25) 0.31 / 0.20; the gradient norm (4) 0.23 / 0.11;
          the step with no dispatch at all 0.47 / 0.32.
  lesson: matmuls (34) 1.54 / 1.34; finishes 0.15 / 0.14 (30); attention backward kv 0.16 / 0.14, forward 0.09 /
          0.09; LayerNorm backward 0.08 / 0.08.
  mid:    matmuls (50) 4.30 / 4.29; finishes 0.41 / 0.40 (62); attention backward kv 0.31 / 0.29, forward 0.17 /
          0.16; LayerNorm backward 0.17 / 0.17; AdamW 0.13 / 0.10.
A short kernel costs more in the step than timed alone (big's LayerNorm backward 21-27 us here, 12.7 us in a pass of
its own, row_kernels.py): the GPU drains the matmul before it and fills the one after.
"""
import argparse
import collections
import re
import time

from tinynn import bench, config, registry

# (name, pattern of "module label.entry point"), each timed as left out; "all" leaves every dispatch out
KINDS = (("matmul", r"matmul_main$|matmul_pair_main$"), ("matmul finish", r"matmul_finish_main$"),
         ("layernorm forward", r"layernorm_forward"), ("layernorm backward", r"layernorm_backward"),
         ("attention forward", r"attention_forward"), ("attention backward kv", r"attention_backward_kv"),
         ("attention backward q", r"attention_backward_q"), ("adamw", r"adamw"),
         ("gradient norm", r"sum_squares|norm\.norm_"), ("cross entropy", r"cross_entropy"),
         ("embedding", r"embedding"), ("all", r""))


def label(event) -> str:
    return event[1].label


def step_ms(train_step, x, steps: int) -> float:
    for _ in range(3):
        train_step(x, x, 3e-4).item()
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(x, x, 3e-4).item()
    return 1e3 * (time.perf_counter() - t0) / steps


def use_events(tape, events: list, result_event: int) -> None:
    """Make the tape replay these events: its compiled programs and the replays recorded ahead are dropped."""
    for future in tape.aheads:
        future.result().release()
    tape.aheads.clear()
    tape.programs.clear()
    tape.events[:] = events
    tape.result_event = result_event


def without(events: list, result_event: int, pattern: str) -> tuple[list, int, int]:
    """The events less the dispatches whose label matches, the result event's new index, and how many left."""
    kept, result_at, dropped = [], None, 0
    for i, event in enumerate(events):
        if event[0] == "dispatch" and re.search(pattern, label(event)):
            dropped += 1
        else:
            kept.append(event)
        if i == result_event:
            result_at = len(kept) - 1  # the last event kept at or before the result's
    return kept, max(result_at, 0), dropped


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--list", action="store_true", help="print the step's labels and counts")
    args = parser.parse_args()
    gpu = registry.select("gpu")
    for path in args.configs:
        train_step, x = bench.lesson_step(gpu, config.load(path))
        full_ms = step_ms(train_step, x, args.steps)  # captures the step, then warms the GPU up
        tape = train_step._run.tape
        events, result_event = list(tape.events), tape.result_event
        dispatches = [e for e in events if e[0] == "dispatch"]
        print(f"== {path}: {len(dispatches)} dispatches, {full_ms:.3f} ms a step", flush=True)
        if args.list:
            for name, count in collections.Counter(map(label, dispatches)).most_common():
                print(f"   {count:4d}  {name}")
        for r in range(args.rounds):
            use_events(tape, events, result_event)
            full_ms = step_ms(train_step, x, args.steps)
            print(f"   round {r + 1}: full step {full_ms:.3f} ms", flush=True)
            for name, pattern in KINDS:
                kept, result_at, dropped = without(events, result_event, pattern)
                if not dropped:
                    continue
                use_events(tape, kept, result_at)
                ms = step_ms(train_step, x, args.steps)
                print(f"   {name:22s} {dropped:4d} dispatches  step without {ms:8.3f} ms  their share "
                      f"{full_ms - ms:7.3f} ms ({1e3 * (full_ms - ms) / dropped:6.1f} us each)", flush=True)
        use_events(tape, events, result_event)


if __name__ == "__main__":
    main()
