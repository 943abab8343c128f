"""How much the matmul choice per shape is worth inside the training step, and whether the autotune (each
candidate timed alone, back to back) ranks candidates the way the step runs them.

For a config's GPU training step, in one process: the autotune's choices (a fresh cache, so it tunes and
its isolated times are kept), then coordinate descent over the step's matmul shape keys, each key over every
candidate, timing the whole replayed step (recaptured per choice set; the median of per-step wall times,
one host sync per step as `tinynn bench`), from the autotune's choices and from `default_variant`. Each trial
also times a replay of the step's matmul dispatches alone (the tape filtered to them), a cheaper proxy.
Then the sets found against the autotune's and the untuned ones, alternating A/B/A/B. Prints one line per
key and writes everything as JSON. --budget 0: no descent, the A/B alone.

What it found (H200, session 6, `step_tune.py apps/bench/lesson.json apps/bench/mid.json --budget 70,55`):
a trial's step time (median of 15 steps) moves by +-0.1 ms, more than one shape's choice is worth (0.01-0.05
ms), so the descent chased noise: its sets lost to the autotune's by 0.25 ms at lesson (3.99-4.02 against
3.77 ms, default 3.67) and 0.06 ms at mid. The step's matmul dispatches replayed alone are precise (+-0.01
ms over 10 replays) and ranked all four sets as the step did, on both configs. See matmul_rank_methods.py.

    python experiments/step_tune.py apps/bench/lesson.json [apps/bench/mid.json]
        [--budget 60,60] [--steps 15] [--out step_tune.json]

--budget: seconds of descent per config (the descents stop at the key where their time runs out).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from tinynn import bench, config, registry
from tinynn_gpu.matmul.selection import run_through
from tinynn_gpu.runtime import capture
from tinynn_gpu.runtime.replay import Ahead, compile_program


def shape(key: str) -> dict:
    return {name: int(value) for name, value in (part.split("=") for part in key.split())}


class StepTrials:
    """A config's training step, recaptured for any matmul choice set and timed."""

    def __init__(self, gpu, cfg):
        self.gpu, self.mm, self.rt = gpu, gpu.mm, gpu.rt
        self.train_step, self.x = bench.lesson_step(gpu, cfg)
        self.isolated = {}  # key -> {variant: ms} from the autotune
        self.mm.defer = False  # tuned in the step's first call, not between steps

        def tune(key, args, runs_of, default):  # the autotune as selection.py runs it, its times kept
            times = self.isolated[key] = run_through(self.mm._timing(runs_of(args), 8, 2))
            return min(times, key=times.get)
        self.mm._tune = tune
        self.trials = 0

    def call(self):
        return self.train_step(self.x, self.x, 3e-4).item()

    def warm(self, seconds=2.0):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            self.call()

    def use(self, choices):
        self.mm.choices.clear()
        self.mm.choices.update(choices)
        run = self.train_step._run
        run._start_over()
        run.calls = capture.EAGER_CALLS  # the next call captures
        self.call()
        assert run.tape is not None, run.eager_reason

    def step_ms(self, choices, steps, heat=3) -> float:
        self.use(choices)
        self.trials += 1
        for _ in range(heat):
            self.call()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.call()
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times)

    def matmul_ms(self, reps) -> float:
        """Wall ms per replay of the captured step's matmul dispatches alone, in step order (GPU-bound)."""
        rt = self.rt
        pipes = {pipe for shader, pipe in rt.entry_points.values() if shader.label.startswith("matmul ")}
        events = [e for e in self.train_step._run.tape.events if e[0] == "dispatch" and e[1] in pipes]
        direct = rt.native is not None
        program, _ = compile_program(events, direct)

        def once():
            rt.flush()
            Ahead(rt.native, program, [], None, None, events).submit() if direct else rt.replayer._replay_methods(program, None)
        once()
        rt.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            once()
        rt.sync()
        return 1e3 * (time.perf_counter() - t0) / reps

    def precompile(self, keys):
        """Every candidate of every key compiled (its pipelines made) before any timing: compiling while
        the GPU idles drops its clock for a second."""
        rt = self.rt
        for key in keys:
            s = shape(key)
            a = rt.empty((s["b"] * s["m"] * s["k"],))
            b = rt.empty(((1 if s["shared"] else s["b"]) * s["k"] * s["n"],))
            out = rt.empty((s["b"] * s["m"] * s["n"],))
            for name in self.mm.candidates:
                if self.mm._fits(name):
                    self.mm.variant(name).record(a, b, out, s["b"], s["m"], s["n"], s["k"], bool(s["ta"]),
                                                 bool(s["tb"]), bool(s["shared"]))
        rt.sync()


def descend(trials: StepTrials, start: dict, keys, steps, deadline, label, log) -> dict:
    """One pass of coordinate descent: per key every candidate in the step (the others fixed), the best
    three timed again, the best mean kept."""
    current = dict(start)
    rows = []
    for key in keys:
        if time.perf_counter() > deadline:
            log(f"  [{label}] out of time before {key}")
            break
        names = [n for n in trials.mm.candidates if trials.mm._fits(n)]
        step = {}
        seq = {}
        for name in names:
            step[name] = [trials.step_ms({**current, key: name}, steps)]
            seq[name] = trials.matmul_ms(5)
        for name in sorted(step, key=lambda n: step[n][0])[:3]:
            step[name].append(trials.step_ms({**current, key: name}, steps))
        mean = {n: statistics.mean(v) for n, v in step.items() if len(v) > 1}
        best = min(mean, key=mean.get)
        iso = trials.isolated.get(key, {})
        log(f"  [{label}] {key}: {current[key]} {statistics.mean(step[current[key]]):.3f} -> {best} {mean[best]:.3f} ms;"
            f" isolated best {min(iso, key=iso.get) if iso else '-'}; matmul-seq best {min(seq, key=seq.get)}")
        rows.append({"key": key, "from": current[key], "to": best, "step_ms": step, "matmul_seq_ms": seq,
                     "isolated_ms": iso})
        current[key] = best
    return {"choices": current, "rows": rows}


def alternate(trials, sets: dict, steps: int, log, rounds: int = 4) -> tuple[dict, dict]:
    """Each choice set's step (ms) and its matmuls replayed alone, the sets taken in turn `rounds` times (A/B/A/B,
    so drift falls on all alike); logged, and returned as two {name: [ms, ...]}."""
    ab = {name: [] for name in sets}
    alone = {name: [] for name in sets}
    for _ in range(rounds):
        for name, choices in sets.items():
            ab[name].append(trials.step_ms(choices, 3 * steps))
            alone[name].append(trials.matmul_ms(10))
    for name in sets:
        log(f"   {name:<20} step {' '.join(f'{v:.3f}' for v in ab[name])} ms (mean {statistics.mean(ab[name]):.3f}); "
            f"matmuls alone {statistics.mean(alone[name]):.3f} ms")
    return ab, alone

def run_config(gpu, path, budget, steps, log) -> dict:
    cfg = config.load(path)
    trials = StepTrials(gpu, cfg)
    t0 = time.perf_counter()
    trials.warm()  # the autotune runs in the first call
    log(f"== {path}: autotune and warm-up {time.perf_counter() - t0:.1f} s")
    tuned = dict(trials.mm.choices)
    # most multiply-adds first: the descent's time goes where the most step time is
    keys = sorted(tuned, key=lambda k: -shape(k)["b"] * shape(k)["m"] * shape(k)["n"] * shape(k)["k"])
    untuned = {k: trials.mm.default_variant(shape(k)["b"], shape(k)["m"], shape(k)["n"], shape(k)["k"]) for k in keys}
    t0 = time.perf_counter()
    trials.precompile(keys)
    log(f"   precompiled {len(trials.mm.candidates)} candidates x {len(keys)} keys in {time.perf_counter() - t0:.1f} s")
    trials.warm(1.0)
    noise = [trials.step_ms(tuned, steps) for _ in range(4)]
    log(f"   autotuned step, 4 trials: {', '.join(f'{v:.3f}' for v in noise)} ms")
    sets = {"autotune": tuned, "default": untuned}
    descents = {}
    if budget > 0:
        t0 = time.perf_counter()
        descents["from autotune"] = descend(trials, tuned, keys, steps, t0 + budget * 0.6, "from autotune", log)
        descents["from default"] = descend(trials, untuned, keys, steps, t0 + budget, "from default", log)
        sets.update({f"best {name}": descent["choices"] for name, descent in descents.items()})
    ab, seq = alternate(trials, sets, steps, log)
    log(f"   {trials.trials} trials")
    for name in sets:
        log(f"   {name} differs from autotune: " + "; ".join(f"{k}: {v}" for k, v in sets[name].items() if v != tuned[k]))
    return {"config": path, "keys": keys, "sets": sets, "ab_step_ms": ab, "ab_matmul_seq_ms": seq,
            "noise_step_ms": noise, "descents": descents, "isolated_ms": trials.isolated}



def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--budget", default="60", help="seconds of descent per config, comma-separated")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--out", default="step_tune.json")
    args = parser.parse_args()
    os.environ.setdefault("TINYNN_CACHE_DIR", tempfile.mkdtemp())  # a fresh autotune
    budgets = [float(b) for b in args.budget.split(",")]
    gpu = registry.select("gpu")
    assert gpu.mm.autotune, "step_tune compares against the autotune: TINYNN_AUTOTUNE must not be 0"
    results = []

    def log(line):
        print(line, flush=True)
    for i, path in enumerate(args.configs):
        results.append(run_config(gpu, path, budgets[min(i, len(budgets) - 1)], args.steps, log))
        with open(args.out, "w") as f:
            json.dump({"device": gpu.device_name, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
