"""The matmuls of one training step, shape by shape: every candidate variant timed on each (GPU timestamps).

    python experiments/matmul_shapes.py --config apps/bench/lesson.json [--extra] [--reps 10]

The shapes come from one real step of the config's model (forward and backward, with their epilogues): the
backend's matmul selector is wrapped while the step records (its plan per shape). Per shape it prints the calls per step, the
best variant and its time, the best of the shipped candidates (what autotune picks), and default_variant's
choice and time; then the totals per step. --extra adds configurations beyond BLOCK_CONFIGS, to look for
better ones.
"""
import argparse
import json
from collections import Counter

import numpy as np

from tinynn import config, registry
from tinynn.bench import lesson_step, time_call
from tinynn_gpu.matmul.configs import BlockConfig
from tinynn_gpu.matmul.problem import Epilogue
from tinynn_gpu.matmul.selection import MatmulSelector

TILES = ((64, 32, 16, 4, 4), (32, 64, 16, 4, 4), (64, 64, 16, 4, 4), (64, 64, 16, 8, 4), (64, 64, 16, 8, 8),
         (128, 64, 16, 8, 4), (64, 128, 16, 4, 8), (128, 64, 16, 8, 8), (64, 128, 16, 8, 8))


def extra_configs():
    """Smaller tiles than the big shipped ones, each with split-K 1 to 8, single- or double-buffered, with
    scalar or vec4 loads."""
    return [BlockConfig(*tile, splits=s, **kind) for tile in TILES for s in (1, 2, 4, 8)
            for kind in ({}, {"double": True}, {"vec4": True, "double": True})]


def step_shapes(gpu, cfg) -> Counter:
    """(transpose_a, transpose_b, shared_b, batch, m, n, k, epilogue parts) -> calls in one training step."""
    shapes, plan = Counter(), gpu.mm.plan

    def spy(a, b, out, batch, m, n, k, ta, tb, shared, epilogue=Epilogue()):
        """The selector's plan of a shape (the backend asks once per shape), its record counting the calls."""
        parts = tuple(p for p in ("bias", "activation", "residual", "row_sums") if getattr(epilogue, p) is not None)
        key = (bool(ta), bool(tb), bool(shared), batch, m, n, k, parts)
        run, description = plan(a, b, out, batch, m, n, k, ta, tb, shared, epilogue)

        def record(*args):
            shapes[key] += 1
            return run(*args)
        return record, description
    gpu.mm.autotune, gpu.mm.plan = False, spy
    train_step, x = lesson_step(gpu, cfg)
    train_step(x, x, 3e-4).item()
    gpu.mm.plan = plan
    return shapes


def operands(gpu, shape):
    """Random operands and epilogue arrays of one shape, in the argument order of `record`."""
    ta, tb, shared, batch, m, n, k, parts = shape
    g = np.random.default_rng(0)

    def array(*dims):
        return gpu.from_numpy(g.standard_normal(dims, dtype=np.float32))
    epilogue = Epilogue(array(n) if "bias" in parts else None, "gelu" if "activation" in parts else None,
                        gpu.rt.empty((batch * m * n,)) if "activation" in parts else None,
                        array(batch * m * n) if "residual" in parts else None,
                        gpu.rt.empty((batch * m,)) if "row_sums" in parts else None)
    b_batch = 1 if shared else batch
    return (array(batch * m * k), array(b_batch * k * n), gpu.rt.empty((batch * m * n,)), batch, m, n, k, ta, tb,
            shared, epilogue)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="apps/bench/lesson.json")
    parser.add_argument("--extra", action="store_true")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    cfg = config.load(args.config)
    gpu = registry.select("gpu")
    shapes = step_shapes(gpu, cfg)
    selector = MatmulSelector(gpu.rt, autotune=False)
    shipped = [name for name in selector.candidates if selector._fits(name)]
    names = list(shipped)
    if args.extra:
        extra = {f"blocked {c.name}": c for c in extra_configs()}
        selector.variants.update(extra)
        names += [name for name in extra if name not in shipped and selector._fits(name)]
    warm = operands(gpu, (False, False, False, 1, 4096, 4096, 4096, ()))
    time_call(lambda: selector.variant(selector.default_variant(1, 4096, 4096, 4096)).record(*warm[:10]),
              gpu.sync, min_seconds=0.0, warmup_seconds=0.5)  # raise the clocks before timing
    print(f"{gpu.device_name}: {len(shapes)} shapes, {sum(shapes.values())} matmuls per step of {args.config}; "
          f"{len(names)} variants ({len(shipped)} shipped)")
    rows, totals = [], Counter()
    for shape, calls in sorted(shapes.items(), key=lambda s: -s[0][3] * s[0][4] * s[0][5] * s[0][6]):
        ta, tb, shared, batch, m, n, k, parts = shape
        times = selector.time_variants(operands(gpu, shape), names, reps=args.reps)
        best = min(times, key=times.get)
        tuned = min(shipped, key=times.get)
        default = selector.default_variant(batch, m, n, k)
        row = {"ta": ta, "tb": tb, "shared": shared, "batch": batch, "m": m, "n": n, "k": k, "epilogue": parts,
               "calls": calls, "best": best, "best_ms": times[best], "tuned": tuned, "tuned_ms": times[tuned],
               "default": default, "default_ms": times[default], "times": times}
        rows.append(row)
        for what in ("best", "tuned", "default"):
            totals[what] += calls * row[f"{what}_ms"]
        gflops = 2 * batch * m * n * k / 1e6
        print(f"ta={ta:d} tb={tb:d} b={batch} {m}x{n}x{k} {'+'.join(parts) or '-'} x{calls}: "
              f"best {best} {times[best] * 1e3:.1f} us ({gflops / times[best] / 1e3:.1f} TFLOP/s); "
              f"shipped {tuned} {times[tuned] * 1e3:.1f} us; default {default} {times[default] * 1e3:.1f} us",
              flush=True)
    print(f"per step: best {totals['best']:.3f} ms, shipped best (autotune) {totals['tuned']:.3f} ms, "
          f"default_variant {totals['default']:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "device": gpu.device_name, "rows": rows, "totals": totals}, f, indent=1)


if __name__ == "__main__":
    main()
