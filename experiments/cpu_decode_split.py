"""Why a batch-16 decode step stays on one thread, measured on the machine at hand: the lesson-sized GPT's 16
products of a decode step (4 layers of qkv, proj, fc, fc2, `--rows` rows: the batch; a layer's caches' worth of
other memory read between layers, as in a step), three ways.

- handoff: one product cut into two column halves on the pool (2 threads): when the caller's half and the pool
  thread's half start and end, and when the caller returns (it sleeps while the other half finishes): a split
  pays only where the two wakes (the pool thread's, then the caller's) take less than half a product.
- strips: the 16 products whole against each cut into 2 column strips on one thread: the bits (OpenBLAS picks
  its kernels by shape, so a strip's bits differ from the whole's) and the time.
- layout: the products with the weights as tinynn stores them, (out, in), against a contiguous (in, out) copy:
  the same bits from 2 rows up (1 row is a matrix-vector product, whose bits differ), and OpenBLAS reads the
  second faster.

    TINYNN_NUM_THREADS=2 taskset -c 0,1 python experiments/cpu_decode_split.py [--rows 16] [--rounds 16]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from tinynn import blas, parallel

SHAPES = [(256, 768), (256, 256), (256, 1024), (1024, 256)] * 4  # (in, out) of a decode step's products


def handoff(x, w, repeats=300) -> str:
    """Median microseconds from the run's start: each half's start and end (caller's, pool thread's), the return."""
    out, main, marks = np.empty((len(x), w.shape[0]), np.float32), threading.get_ident(), []
    half = w.shape[0] // 2
    for _ in range(repeats):
        t0, seen = time.perf_counter(), {}

        def tile(cols):
            start = time.perf_counter()
            np.matmul(x, w.T[:, cols], out=out[:, cols])
            seen[threading.get_ident() == main] = (start - t0, time.perf_counter() - t0)
        parallel.run(tile, [slice(0, half), slice(half, None)])
        if len(seen) == 2:  # the pool thread took a half
            marks.append((*seen[True], *seen[False], time.perf_counter() - t0))
        time.sleep(2e-4)  # a decode step's other ops meanwhile
    if not marks:
        return "the caller ran both halves every time (no pool thread woke in time)"
    m = [statistics.median(v) * 1e6 for v in zip(*marks)]
    t0 = time.perf_counter()
    for _ in range(repeats):
        np.matmul(x, w.T, out=out)
    whole = (time.perf_counter() - t0) / repeats * 1e6
    return (f"caller {m[0]:.0f}-{m[1]:.0f} us, pool thread {m[2]:.0f}-{m[3]:.0f} us, returned at {m[4]:.0f} us "
            f"({len(marks)} of {repeats} runs shared); whole on one thread {whole:.0f} us")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=16, help="the batch: rows of each product")
    p.add_argument("--rounds", type=int, default=16)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((n, k)).astype(np.float32) / 16 for k, n in SHAPES]  # (out, in)
    in_out = [np.ascontiguousarray(w.T) for w in weights]
    xs = {k: rng.standard_normal((args.rows, k)).astype(np.float32) for k in {k for k, _ in SHAPES}}
    caches = rng.standard_normal((4, 2 * args.rows * 128 * 256)).astype(np.float32)  # a layer's K and V, full window

    def strips(x, w):
        half = w.shape[0] // 2
        return np.concatenate([x @ w.T[:, :half], x @ w.T[:, half:]], axis=1)
    ways = {"whole (out, in)": lambda x, i: x @ weights[i].T, "2 strips (out, in)": lambda x, i: strips(x, weights[i]),
            "whole (in, out)": lambda x, i: x @ in_out[i]}
    with blas.one_thread():
        print(f"{parallel.num_threads()} threads; handoff of a {args.rows} x 256 x 1024 product cut in two: "
              f"{handoff(xs[256], weights[2]) if parallel.num_threads() > 1 else 'needs 2 threads'}")
        for name, way in ways.items():
            same = all(np.array_equal(way(xs[k], i), xs[k] @ weights[i].T) for i, (k, _) in enumerate(SHAPES[:4]))
            print(f"  {name:<20} the bits of whole (out, in): {same}")
        times = {name: [] for name in ways}
        for r in range(args.rounds):
            for name in (list(ways) if r % 2 else list(ways)[::-1]):  # alternate the order
                total = 0.0
                for i, (k, _) in enumerate(SHAPES):
                    if i % 4 == 0:
                        caches[i // 4].sum()  # the layer's attention reads its caches
                    t0 = time.perf_counter()
                    ways[name](xs[k], i)
                    total += time.perf_counter() - t0
                times[name].append(total * 1e6)
    base = times["whole (out, in)"]
    for name, t in times.items():
        ratio = statistics.median(b / v for b, v in zip(base, t))
        print(f"  {name:<20} {statistics.median(t):>6,.0f} us for the step's 16 products (median of {args.rounds}); "
              f"whole (out, in) / this, pairwise median: {ratio:.2f}")


if __name__ == "__main__":
    main()
