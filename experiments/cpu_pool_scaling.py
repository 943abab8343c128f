"""Does the thread pool scale on this machine, op by op? Each kind of work the lesson step gives the pool, alone,
at 1, 2, 4, ... threads up to the cores available (median of `--reps` runs, ms, and the speed-up over 1 thread):

- elementwise: a GELU-like formula over 8M float32 (parallel.elementwise, blocks of 32K elements), and the same
  with blocks 4x and 16x as large (x4, x16: fewer hand-overs of the GIL, larger temporaries);
- rows: a softmax over 16K rows of 512 (parallel.into);
- product: 2048 x 1024 @ 1024 x 1024 (parallel.matmul: tiles, each one BLAS call on one BLAS thread);
- plain threads: the elementwise formula on n slices, one threading.Thread each (no pool: does NumPy release
  the GIL here at all?);
- handoff: an empty run of n items (what a run costs before any work).

    python experiments/cpu_pool_scaling.py [--reps 7]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from tinynn import heap, parallel


def gelu_like(a):
    return a * (1.0 / (1.0 + np.exp(-1.702 * a)))


def softmax(rows):
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def plain_threads(x, n):
    out = np.empty_like(x)
    bounds = np.linspace(0, len(x), n + 1).astype(int)

    def part(lo, hi):
        out[lo:hi] = gelu_like(x[lo:hi])
    threads = [threading.Thread(target=part, args=(bounds[i], bounds[i + 1])) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def with_blocks(factor, fn):
    size = parallel.BLOCK_ELEMENTS
    parallel.BLOCK_ELEMENTS = size * factor
    try:
        return fn()
    finally:
        parallel.BLOCK_ELEMENTS = size


def timed(fn, reps) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    heap.keep_freed_memory()  # as the NumPy backend does when it loads
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1 << 23, dtype=np.float32)
    rows = rng.standard_normal((1 << 14, 512), dtype=np.float32)
    a = rng.standard_normal((2048, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 1024), dtype=np.float32)
    work = {
        "elementwise": lambda: parallel.elementwise(gelu_like, x),
        "elementwise x4": lambda: with_blocks(4, lambda: parallel.elementwise(gelu_like, x)),
        "elementwise x16": lambda: with_blocks(16, lambda: parallel.elementwise(gelu_like, x)),
        "rows": lambda: parallel.into(softmax, np.empty_like(rows), rows, row_size=512),
        "product": lambda: parallel.matmul(a, b),
        "plain threads": None,
        "handoff (us)": None,
    }
    cores, base = parallel.cores(), {}
    counts = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= cores]
    print(f"{cores} cores; ms (speed-up over 1 thread)")
    print(f"{'threads':>8} " + " ".join(f"{name:>18}" for name in work))
    for n in counts:
        parallel.set_num_threads(n)
        cells = []
        for name, fn in work.items():
            if name == "plain threads":
                ms = timed(lambda: plain_threads(x, n), args.reps)
            elif name == "handoff (us)":
                items = list(range(n))
                ms = timed(lambda: parallel.run(lambda i: None, items), args.reps * 20) * 1e3
            else:
                ms = timed(fn, args.reps)
            base.setdefault(name, ms)
            cells.append(f"{ms:8.2f} ({base[name] / ms:4.1f}x)")
        print(f"{n:>8} " + " ".join(f"{c:>18}" for c in cells), flush=True)
    parallel.set_num_threads(None)


if __name__ == "__main__":
    main()
