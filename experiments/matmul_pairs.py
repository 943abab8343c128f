"""A linear layer's backward matmuls, g @ W (its input's gradient) and g.T @ x (its weight's, with the bias
gradient as row sums), one after the other against paired in one dispatch (PairedMatmul), for every linear layer
shape of a config's model; and the question that led there: does one dispatch of twice the work (batch 2) take
much less than twice the time of batch 1?

    python experiments/matmul_pairs.py apps/bench/lesson.json apps/bench/mid.json [--batch2]

Per shape, us: each alone with its own tuned choice (the sum), and the best pair with its name. --batch2 also
prints, for each of the two matmuls, the best shipped candidate at batch 1 and batch 2 and 2 * b1 / b2.

H200 (session 13, --batch2 on main at 02883ee), us per layer, the four linear layers' backward matmuls summed:
lesson 288.0 at batch 1 against 237.9 for half of batch 2; mid 535.4 against 479.4; big 1691.0 against 1607.9.
2 * b1 / b2 ran 1.11-1.33 on the lesson's shapes, 1.04-1.42 on mid's, 1.02-1.12 on big's: the small matmuls leave
the GPU part idle, and a second one beside them fills it.
"""
import argparse
import os
import tempfile

import numpy as np

from tinynn import config, registry
from tinynn.bench import time_call
from tinynn_gpu.matmul.problem import Epilogue
from tinynn_gpu.matmul.selection import SEPARATE, MatmulSelector


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--batch2", action="store_true")
    args = parser.parse_args()
    gpu = registry.select("gpu")
    os.environ["TINYNN_CACHE_DIR"] = tempfile.mkdtemp()  # tuned afresh, the user's cache untouched
    selector = MatmulSelector(gpu.rt, autotune=True)
    g = np.random.default_rng(0)

    def array(*shape):
        return gpu.from_numpy(g.standard_normal(shape, dtype=np.float32))
    warm = (array(4096, 4096), array(4096, 4096), gpu.rt.empty((4096, 4096)), 1, 4096, 4096, 4096, False, False,
            False)
    time_call(lambda: selector.variant(selector.default_variant(1, 4096, 4096, 4096)).record(*warm), gpu.sync,
              min_seconds=0.0, warmup_seconds=0.5)  # raise the clocks before timing
    for path in args.configs:
        cfg = config.load(path)
        rows, c = cfg.batch_size * cfg.block_size, cfg.n_embd
        total_apart = total_paired = 0.0
        for ins, outs in ((c, 3 * c), (c, c), (c, 4 * c), (4 * c, c)):
            grad, x, weight = array(rows, outs), array(rows, ins), array(outs, ins)
            first = (grad, weight, gpu.rt.empty((rows, ins)), 1, rows, ins, outs, False, False, False, Epilogue())
            second = (grad, x, gpu.rt.empty((outs, ins)), 1, outs, ins, rows, True, False, False,
                      Epilogue(row_sums=gpu.rt.empty((outs,))))
            times = selector.time_pair(first, second)  # each alone is tuned first (into a cache of this run's own)
            best = min((name for name in times if name != SEPARATE), key=times.get)
            check(gpu, selector.pair_variant(best), first, second)
            total_apart += times[SEPARATE]
            total_paired += min(times[best], times[SEPARATE])
            print(f"{path} {rows}x{ins}x{outs} + {outs}x{ins}x{rows}: apart {times[SEPARATE] * 1e3:.1f} us, "
                  f"paired {times[best] * 1e3:.1f} us ({best})", flush=True)
            if args.batch2:
                for what, problem in ("g @ W", first), ("g.T @ x", second):
                    _, _, _, _, m, n, k, ta, _, _, epilogue = problem
                    best_of = {}
                    for batch in 1, 2:
                        operands = (array(batch * m * k), array(batch * k * n), gpu.rt.empty((batch * m * n,)),
                                    batch, m, n, k, ta, False, False,
                                    Epilogue(row_sums=gpu.rt.empty((batch * m,))) if epilogue.row_sums else Epilogue())
                        best_of[batch] = min(selector.time_variants(operands).values())
                    print(f"    {what} {m}x{n}x{k}: batch 1 {best_of[1] * 1e3:.1f} us, batch 2 {best_of[2] * 1e3:.1f}"
                          f" us, 2 * b1 / b2 = {2 * best_of[1] / best_of[2]:.2f}", flush=True)
        print(f"{path}: a layer's backward matmuls {total_apart * 1e3:.1f} us apart, {total_paired * 1e3:.1f} with "
              "the faster of the two", flush=True)


def check(gpu, pair, first, second):
    """The pair's two results (fresh outputs) against float64: a timing of wrong results would mean nothing."""
    outputs = gpu.rt.empty(first[2].shape), gpu.rt.empty(second[2].shape)
    pair.plan(first[3:], second[3:])(*first[:2], outputs[0], first[10], *second[:2], outputs[1], second[10])
    grad, weight, x = (gpu.to_numpy(a).astype(np.float64) for a in (first[0], first[1], second[1]))
    for got, want, size in zip(outputs, (grad @ weight, grad.T @ x), (abs(grad) @ abs(weight), abs(grad).T @ abs(x))):
        error = np.linalg.norm(gpu.to_numpy(got) - want) / np.linalg.norm(size)
        if not error <= 1e-5:
            raise SystemExit(f"{pair.describe()} computed a wrong result (error {error:.1e} of its terms' size)")


if __name__ == "__main__":
    main()
