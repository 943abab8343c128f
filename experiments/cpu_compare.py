"""tinynn's NumPy backend against PyTorch on the CPU, back to back on one machine: the lesson training step
(L4 d256 T128 B16, AdamW, clip 1.0) on all cores, on 2 (`taskset -c 0,1`, 2 threads) and on 1, and lesson-sized
generation (117 new tokens after an 11-token prompt, top-k 20) at batch 1 and 16 on all cores and on 2.

Each measurement runs in a process of its own, pinned with taskset, with TINYNN_NUM_THREADS and PyTorch's
OMP_NUM_THREADS set to the cores it may use; tinynn and PyTorch alternate, and the table keeps each one's best
run (ms per step: lower is better; tokens/s: higher). tinynn is the checkout's packages/tinynn-core/src.
On all cores variants of tinynn's step are timed too (VARIANTS: products whole on OpenBLAS's own threads, with
the other ops on a smaller pool or not; one tile a thread; blocks 16x as large), and at each setting batch-16
generation with a decode step's products on one BLAS thread (GEN_VARIANTS). Measurements still to come when `--budget`
seconds have passed are skipped, so the table always prints. The first tinynn step of each setting also prints a
DIAG line: 3 more steps' user and system time, page faults, and each thread's time on a core, waiting for one and
asleep (the GIL, the pool's barrier), which says whether the threads ran side by side.

    python experiments/cpu_compare.py [--budget 230] [--reps 2]      # or experiments/cpu_compare.sh
    python experiments/cpu_compare.py --generation --reps 3          # generation only, 3 alternating rounds
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "packages" / "tinynn-core" / "src"
LESSON = ROOT / "apps" / "bench" / "lesson.json"
ISSUE_REFERENCE = ROOT / ".device" / "bench" / "torch_gpt_reference.py"  # the reference issue 44 measured with
NUMBER = r"([0-9][0-9,]*\.?[0-9]*)"


# --- workers: one measurement each, in a process of its own; each prints "RESULT <number>" ---

def tinynn_step(variant: str = "") -> float:
    from tinynn import bench, blas, config, parallel, registry
    if variant.startswith("blas-threads"):  # products whole, threaded by OpenBLAS (as before the pool ran them);
        blas._looked, blas._calls = True, None  # -pool-N: the other ops on a pool of N threads
        if "-pool-" in variant:
            parallel.set_num_threads(int(variant.rsplit("-", 1)[1]))
    elif variant.startswith("big-blocks"):  # elementwise and row blocks 4x (or -N: Nx) as large: fewer GIL handoffs
        parallel.BLOCK_ELEMENTS *= int(variant.split("-")[2]) if variant.count("-") == 2 else 4
    elif variant == "one-tile-each":  # a product's tiles: one a thread instead of TILES_PER_THREAD
        parallel.TILES_PER_THREAD = 1
    elif variant == "coarse":  # both: blocks 16x as large, one tile a thread
        parallel.BLOCK_ELEMENTS, parallel.TILES_PER_THREAD = parallel.BLOCK_ELEMENTS * 16, 1
    ms = bench.bench_train(registry.select("cpu"), config.load(LESSON), 5)["ms_per_step"]
    if variant == "diag":  # the first run of each setting
        step, x = bench.lesson_step(registry.select("cpu"), config.load(LESSON))
        step(x, x, 3e-4).item()
        print(diagnosis(lambda: step(x, x, 3e-4).item()))
    return ms


def diagnosis(step, steps=3) -> str:
    """One line on where a step's time went, per step over `steps` steps: the process's user and system CPU time
    and page faults, and each thread's time on a core ("run"), waiting for one ("queue": other programs) and
    neither ("sleep": the GIL, a lock, an idle pool thread), with the cores its affinity allows; and how BLAS
    is held. Linux only (/proc); elsewhere the line says so."""
    import resource
    import threading

    from tinynn import blas

    def threads():
        out = {}
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, queue = (int(v) / 1e6 for v in f.read().split()[:2])
            out[tid] = (run, queue, len(os.sched_getaffinity(int(tid))))
        return out
    if not os.path.isdir("/proc/self/task"):
        return "DIAG no /proc"
    before, r0, t0 = threads(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(steps):
        step()
    wall, r1, after = (time.perf_counter() - t0) * 1e3, resource.getrusage(resource.RUSAGE_SELF), threads()
    main = str(threading.get_native_id())
    rows = []
    for tid, (run, queue, cores) in after.items():
        run0, queue0, _ = before.get(tid, (0.0, 0.0, 0))
        run, queue = run - run0, queue - queue0
        if run > 0.01 * wall:
            rows.append((tid == main, run / steps, queue / steps, (wall - run - queue) / steps, cores))
    rows.sort(reverse=True)
    per = " ".join(f"{'main' if m else 't'}:{r:.0f}/{q:.0f}/{s:.0f}/{c}" for m, r, q, s, c in rows)
    return (f"DIAG per step: wall {wall / steps:.0f} ms, user {(r1.ru_utime - r0.ru_utime) * 1e3 / steps:.0f}, "
            f"sys {(r1.ru_stime - r0.ru_stime) * 1e3 / steps:.0f}, faults {(r1.ru_minflt - r0.ru_minflt) / steps:.0f}; "
            f"BLAS control {blas.available()}, BLAS threads {blas.threads()}; "
            f"threads run/queue/sleep ms / cores allowed: {per}")


def tinynn_generation(batch: int, variant: str = "") -> float:
    sys.path.insert(0, str(ROOT / "apps" / "bench"))
    import generation
    import numpy as np

    import tinynn
    from tinynn import parallel, registry
    from tinynn.model import GPT
    if variant.startswith("tiles-"):  # a decode step's products cut into tiles of at least 2^n multiply-adds
        parallel.MIN_TILE_WORK = 1 << int(variant.split("-")[1])
    elif variant == "pool-decode":  # a decode step's products on one BLAS thread, as the pool's tiles run
        parallel.FEW_ROWS = 0
    tinynn.manual_seed(0)
    model = GPT(generation.LESSON).to(registry.select("cpu"))
    model.generate(np.repeat(generation.PROMPT[None, :], batch, 0), 140, **generation.SAMPLING)  # warm-up
    return generation.tokens_per_s(model, batch, 117, "generate", reps=3)


VARIANTS = ("blas-threads", "blas-threads-pool-1", "blas-threads-pool-4", "one-tile-each", "coarse")
# with --generation: a decode step's products on one BLAS thread (tiles-N: cut by MIN_TILE_WORK 2^N too)
GEN_VARIANTS = ("pool-decode",)
WORKERS = {"tinynn-step": tinynn_step, "tinynn-gen": tinynn_generation}


# --- the orchestrator ---

def environment(cores: str, threads: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="", TINYNN_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    env.pop("OPENBLAS_NUM_THREADS", None)  # tinynn sets BLAS's thread count itself
    return env


def measure(what: str, cores: str, threads: int, command: list[str], pattern: str, timeout: float) -> float | None:
    """Run command pinned to `cores`; the first number `pattern` finds in its output, or None."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run(["taskset", "-c", cores, *command], env=environment(cores, threads), cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
        found = re.search(pattern, done.stdout)
        for line in done.stdout.splitlines():
            if line.startswith("DIAG"):
                print(f"    {what}: {line}", flush=True)
        value = float(found.group(1).replace(",", "")) if found else None
        if value is None:
            print(f"    {what}: no result (exit {done.returncode}): {(done.stderr or done.stdout)[-400:]}", flush=True)
    except subprocess.TimeoutExpired:
        value = None
        print(f"    {what}: timed out after {timeout:.0f} s", flush=True)
    print(f"    {what:<34} {'-' if value is None else f'{value:,.1f}':>10}   ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    return value


def best(values, higher=False):
    values = [v for v in values if v is not None]
    return (max(values) if higher else min(values)) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=230, help="seconds; later measurements are skipped")
    p.add_argument("--reps", type=int, default=2, help="runs of each step measurement (tinynn and PyTorch alternate)")
    p.add_argument("--generation", action="store_true", help="generation only, --reps rounds of it")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--variant", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        value = WORKERS[args.worker](args.batch, args.variant) if args.worker == "tinynn-gen" else \
            WORKERS[args.worker](args.variant)
        print(f"RESULT {value}")
        return
    start = time.perf_counter()
    all_cores = len(os.sched_getaffinity(0))
    py = sys.executable
    settings = [(f"0-{all_cores - 1}", all_cores)] + [s for s in (("0,1", 2), ("0", 1)) if s[1] < all_cores]
    model = subprocess.run(["sh", "-c", "lscpu | grep -m1 'Model name'"], capture_output=True, text=True).stdout
    print(f"{all_cores} cores, {model.strip()}; tinynn from {SRC}", flush=True)
    subprocess.run([py, "-c", "import numpy, tinynn, tinynn.blas as b, tinynn.parallel as p; "
                    "print('numpy', numpy.__version__, '| BLAS thread control:', b.available(), '| pool:', p.describe())"],
                   env=environment(settings[0][0], all_cores), cwd=ROOT)
    subprocess.run([py, "-c", "import torch; print('torch', torch.__version__, torch.__config__.parallel_info().splitlines()[:3])"],
                   env=environment(settings[0][0], all_cores), cwd=ROOT)
    rows = {}

    def left() -> float:
        return args.budget - (time.perf_counter() - start)

    def run(what, cores, threads, command, pattern, timeout=60.0):
        if left() < 5:
            print(f"    {what}: skipped (budget spent)", flush=True)
            return None
        return measure(what, cores, threads, command, pattern, min(timeout, left()))

    print("lesson training step, ms (lower is better)", flush=True)
    for cores, threads in ([] if args.generation else settings):
        ours, theirs, issue = [], [], []
        for rep in range(args.reps):
            ours.append(run(f"tinynn step, {threads} threads", cores, threads,
                            [py, __file__, "--worker", "tinynn-step", "--variant", "" if rep else "diag"],
                            r"RESULT " + NUMBER))
            theirs.append(run(f"torch step, {threads} threads", cores, threads,
                              [py, "apps/bench/torch_reference.py", "--configs", "lesson"], r"lesson_eager_ms " + NUMBER))
        if ISSUE_REFERENCE.exists():
            issue.append(run(f"torch (issue's reference), {threads} thr.", cores, threads,
                             [py, str(ISSUE_REFERENCE), "--configs=lesson"], r"lesson\w*_ms\W+" + NUMBER))
        rows[("step", threads)] = best(ours), best(theirs), best(issue)
        if threads == all_cores and threads > 2:  # what the pool's products and block size buy, for the record
            for variant in VARIANTS:
                rows[("variant", variant)] = run(f"tinynn step, {variant}", cores, threads,
                                                 [py, __file__, "--worker", "tinynn-step", "--variant", variant],
                                                 r"RESULT " + NUMBER)
    print("generation, tokens/s (higher is better)", flush=True)
    for cores, threads in settings[:2]:
        ours, theirs = {1: [], 16: []}, {1: [], 16: []}
        for rep in range(args.reps if args.generation else 1):  # PyTorch and tinynn alternate
            if left() > 5:
                t0 = time.perf_counter()
                try:
                    out = subprocess.run(["taskset", "-c", cores, py, "apps/bench/torch_cpu_generation.py",
                                          str(threads)], env=environment(cores, threads), cwd=ROOT,
                                         capture_output=True, text=True, timeout=min(90, left())).stdout
                except subprocess.TimeoutExpired:
                    out = ""
                torch_rates = {int(batch): float(rate.replace(",", "")) for batch, rate in
                               re.findall(r"batch\s+(\d+),.*?:\s+" + NUMBER + " tokens/s", out)}
                for batch in ours:
                    theirs[batch].append(torch_rates.get(batch))
                print(f"    torch generation, {threads} threads         {torch_rates}   "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
            for batch in ours:
                ours[batch].append(run(f"tinynn generation, batch {batch}, {threads} thr.", cores, threads,
                                       [py, __file__, "--worker", "tinynn-gen", "--batch", str(batch)],
                                       r"RESULT " + NUMBER))
        for batch in ours:
            rows[("gen", threads, batch)] = best(ours[batch], higher=True), best(theirs[batch], higher=True)
        for variant in GEN_VARIANTS:  # batch 16's products another way
            rows[("gen-variant", threads, variant)] = run(
                f"tinynn generation, batch 16, {variant}", cores, threads,
                [py, __file__, "--worker", "tinynn-gen", "--batch", "16", "--variant", variant], r"RESULT " + NUMBER)
    print(f"\nsummary ({time.perf_counter() - start:.0f} s; best of {args.reps} runs for the steps"
          f"{' and generation' if args.generation else ''})")
    print("| measurement | cores | tinynn | PyTorch | tinynn / PyTorch | PyTorch (issue's reference) |")
    print("|---|---:|---:|---:|---:|---:|")

    def fmt(v, digits=0):
        return "-" if v is None else f"{v:,.{digits}f}"
    for cores, threads in ([] if args.generation else settings):
        ours, theirs, issue = rows.get(("step", threads), (None, None, None))
        ratio = f"{ours / theirs:.2f}x" if ours and theirs else "-"
        print(f"| lesson step, ms | {threads} | {fmt(ours)} | {fmt(theirs)} | {ratio} | {fmt(issue)} |")
    for variant in VARIANTS:
        if ("variant", variant) in rows:
            print(f"| lesson step, ms, {variant} | {all_cores} | {fmt(rows['variant', variant])} | | | |")
    for cores, threads in settings[:2]:
        for batch in (1, 16):
            ours, theirs = rows.get(("gen", threads, batch), (None, None))
            ratio = f"{ours / theirs:.2f}x" if ours and theirs else "-"
            print(f"| generation batch {batch}, tokens/s | {threads} | {fmt(ours)} | {fmt(theirs)} | {ratio} | |")
        for variant in GEN_VARIANTS:
            if rows.get(("gen-variant", threads, variant)) is not None:
                ours, theirs = rows["gen-variant", threads, variant], rows.get(("gen", threads, 16), (None, None))[1]
                ratio = f"{ours / theirs:.2f}x" if ours and theirs else "-"
                print(f"| generation batch 16, {variant}, tokens/s | {threads} | {fmt(ours)} | {fmt(theirs)} | "
                      f"{ratio} | |")


if __name__ == "__main__":
    main()
