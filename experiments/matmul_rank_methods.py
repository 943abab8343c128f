"""Which way of timing a matmul variant alone ranks the candidates as the training step runs them.

The reference, per shape key of a config's step: the step's matmul dispatches replayed alone, recaptured
with that key's variant changed and every other key at the autotune's choice (`StepTrials.matmul_ms`: +-0.01
ms over 10 replays on an H200, and it ranked whole choice sets as the step did: step_tune.py). Against it:
  hot   the autotune as it is: the same operands back to back in one timed pass (`time_variants`);
  cold  the same pass over copies of the operands, rotated so that no call finds its operands in L2 (the
        step's activations are new arrays at every call; an H200's L2 holds about 50 MB).
Per key it prints each method's winner and what that winner costs in the reference (regret, us per step);
then the step, A/B/A/B, with the hot (the autotune's), cold, reference and untuned choice sets.

Why (H200, session 6): at the lesson size the untuned `default_variant` choices ran the step 0.10-0.16 ms
faster than the autotune's (3.61-3.67 against 3.77-3.78 ms) and its matmuls alone 0.07-0.12 ms faster;
ranking the candidates inside the step's matmul sequence, one timed pass with stand-in operands reused per
shape, picked exactly the hot ranking's winners. So the neighbours in the sequence do not change the
ranking; the operands' cache state (or the timing method itself) is the remaining suspect.

    python experiments/matmul_rank_methods.py apps/bench/lesson.json [apps/bench/mid.json]
        [--budget 40] [--out rank_methods.json]

--budget: seconds of reference timing per config (it stops at the key where its time runs out; keys in order
of multiply-adds). --min-macs: tune smaller shapes too (a smoke run on a small config).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from step_tune import StepTrials, alternate, shape
from tinynn import config, registry
from tinynn_gpu.matmul.selection import MatmulSelector

COLD_BYTES = 256 << 20  # the operand copies a cold pass rotates over: several times an H200's L2


def cold_times(trials: StepTrials, key, names, rounds=2) -> dict[str, float]:
    """ms per call of each variant, timed as one pass over operand copies that together exceed L2."""
    gpu, rt, mm = trials.gpu, trials.rt, trials.mm
    s = shape(key)
    sizes = (s["b"] * s["m"] * s["k"], (1 if s["shared"] else s["b"]) * s["k"] * s["n"], s["b"] * s["m"] * s["n"])
    copies = max(4, min(64, -(-COLD_BYTES // (4 * sum(sizes)))))
    operands = [[gpu.full((size,), 0.5) for size in sizes] for _ in range(copies)]
    layout = (s["b"], s["m"], s["n"], s["k"], bool(s["ta"]), bool(s["tb"]), bool(s["shared"]))

    def rotate(name):
        for a, b, out in operands:
            mm.variant(name).record(a, b, out, *layout)
    heat_until = time.perf_counter() + 0.5
    while time.perf_counter() < heat_until:
        rotate(names[0])
        rt.sync()
    times = {}
    for _ in range(rounds):
        for name in names:
            times[name] = min(times.get(name, float("inf")), timed_ms(rt, lambda: rotate(name)) / copies)
    return times


def timed_ms(rt, record) -> float:
    """ms of what `record` records: one pass with timestamps where the adapter has them, else the wall clock."""
    if "timestamp-query" in rt.ctx.features:
        return rt.time_pass(record, 1)
    t0 = time.perf_counter()
    record()
    rt.sync()
    return 1e3 * (time.perf_counter() - t0)


def reference_times(trials: StepTrials, base, key, names) -> dict[str, float]:
    times = {}
    for name in names:
        trials.use({**base, key: name})
        times[name] = trials.matmul_ms(5)
    return times


def regret(times, reference) -> float:
    """What the method's winner costs in the reference, us per step."""
    return 1e3 * (reference[min(times, key=times.get)] - min(reference.values()))


def rank_correlation(times, reference) -> float:
    names = list(reference)
    ranks = [{name: i for i, name in enumerate(sorted(names, key=t.get))} for t in (times, reference)]
    n = len(names)
    return 1 - 6 * sum((ranks[0][x] - ranks[1][x]) ** 2 for x in names) / (n * (n * n - 1)) if n > 1 else 1.0


def run_config(gpu, path, budget, steps, log) -> dict:
    trials = StepTrials(gpu, config.load(path))
    trials.warm()
    tuned = dict(trials.mm.choices)
    keys = sorted(trials.isolated, key=lambda k: -shape(k)["m"] * shape(k)["n"] * shape(k)["k"] * shape(k)["b"])
    names = [n for n in trials.mm.candidates if trials.mm._fits(n)]
    trials.precompile(keys)
    log(f"== {path}: {len(keys)} tuned keys, {len(names)} candidates")
    rows, deadline = [], time.perf_counter() + budget
    for key in keys:
        if time.perf_counter() > deadline:
            log(f"   out of time before {key}")
            break
        hot = trials.isolated[key]
        cold = cold_times(trials, key, names)
        ref = reference_times(trials, tuned, key, names)
        rows.append({"key": key, "hot": hot, "cold": cold, "reference": ref})
        log(f"   {key}: reference {min(ref, key=ref.get)}; hot {min(hot, key=hot.get)} (regret "
            f"{regret(hot, ref):.1f} us, rank corr {rank_correlation(hot, ref):.2f}); cold {min(cold, key=cold.get)} "
            f"(regret {regret(cold, ref):.1f} us, rank corr {rank_correlation(cold, ref):.2f})")
    untuned = {k: trials.mm.default_variant(shape(k)["b"], shape(k)["m"], shape(k)["n"], shape(k)["k"]) for k in tuned}
    sets = {"hot (autotune)": tuned, "default": untuned}
    for method in ("cold", "reference"):
        sets[method] = {**tuned, **{row["key"]: min(row[method], key=row[method].get) for row in rows}}
    ab, alone = alternate(trials, sets, steps, log)
    return {"config": path, "rows": rows, "sets": sets, "ab_step_ms": ab, "ab_matmuls_alone_ms": alone}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--budget", type=float, default=40.0)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--min-macs", type=int)
    parser.add_argument("--out", default="rank_methods.json")
    args = parser.parse_args()
    os.environ.setdefault("TINYNN_CACHE_DIR", tempfile.mkdtemp())  # a fresh autotune, its times kept
    if args.min_macs is not None:
        MatmulSelector.tune_min_macs = args.min_macs
    gpu = registry.select("gpu")
    assert gpu.mm.autotune, "this compares against the autotune: TINYNN_AUTOTUNE must not be 0"
    results = []
    for path in args.configs:
        results.append(run_config(gpu, path, args.budget, args.steps, lambda line: print(line, flush=True)))
        with open(args.out, "w") as f:
            json.dump({"device": gpu.device_name, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
