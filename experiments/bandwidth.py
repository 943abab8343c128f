"""The bandwidth-bound kernels timed alone on a config's real parameter shapes: the gradient norm, AdamW,
and the reductions and LayerNorm gradients of its activations, each checked against NumPy, then timed with
GPU timestamps and reported as GB/s (bytes each kernel must move / its GPU time).

    python experiments/bandwidth.py [--config apps/bench/big.json] [--reps 10]

TINYNN_SUBGROUPS=0 times the workgroup-memory reductions instead of the subgroup ones.
"""
import argparse
import time

import numpy as np

from tinynn import config, registry
from tinynn.model import GPT

VOCAB = 65  # tinynn bench's vocabulary


def timed(gpu, fn, reps, warmup_seconds=0.5):
    """(ms per call, per-kernel rows) from GPU timestamps over reps calls, after warmup_seconds of calls
    (an idle H200 runs at low clocks until it has been busy for a few hundred ms)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup_seconds:
        fn()
        gpu.sync()
    rows = gpu.profile(lambda: [fn() for _ in range(reps)])
    return sum(r["ms"] for r in rows) / reps, rows


def report(name, nbytes, ms, rows, reps):
    print(f"{name:<34} {ms * 1e3:9.1f} us  {nbytes / ms / 1e6:8.1f} GB/s  "
          + ", ".join(f"{r['kernel']} x{r['calls'] // reps} {r['ms'] / reps * 1e3:.1f} us" for r in rows))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="apps/bench/big.json")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    gpu = registry.select("gpu")
    cfg = config.load(args.config)
    shapes = [p.shape for p in GPT(cfg.model_config(VOCAB)).parameters()]
    total = sum(int(np.prod(s)) for s in shapes)
    print(f"{gpu.device_name}, subgroups: {'subgroup' in gpu.ctx.features}; {args.config}: {len(shapes)} "
          f"parameters, {total / 1e6:.1f} M elements")
    g = np.random.default_rng(0)
    host = [[g.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(4)]
    host[3] = [np.abs(v) for v in host[3]]
    params, grads, ms_, vs = ([gpu.from_numpy(a) for a in kind] for kind in host)

    norm = gpu.to_numpy(gpu.global_norm(grads))
    want = np.sqrt(sum((a.astype(np.float64) ** 2).sum() for a in host[1]))
    print(f"global norm {norm:.6g} vs NumPy {want:.6g} (rel err {abs(norm - want) / want:.1e})")
    ms, rows = timed(gpu, lambda: gpu.global_norm(grads), args.reps)
    report("global_norm", 4 * total, ms, rows, args.reps)

    hyper = gpu.from_numpy(np.array([1e-4, 0.1, 0.01], np.float32))
    scale = gpu.from_numpy(np.array(0.5, np.float32))

    def adamw():
        gpu.adamw_update_(params, grads, ms_, vs, hyper, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1,
                          grad_scale=scale)
    ms, rows = timed(gpu, adamw, args.reps)
    report("adamw_update_ (7 x 4 B / element)", 28 * total, ms, rows, args.reps)

    rows_n, c = cfg.batch_size * cfg.block_size, cfg.n_embd
    for width in (c, 4 * c):
        x = g.standard_normal((rows_n, width)).astype(np.float32)
        dx = gpu.from_numpy(x)
        for axes in ((0,), (1,)):
            got = gpu.to_numpy(gpu.sum(dx, axes))
            err = np.abs(got - x.astype(np.float64).sum(axis=axes)).max()
            ms, rows = timed(gpu, lambda: gpu.sum(dx, axes), args.reps)
            report(f"sum {x.shape} over {axes} (err {err:.1e})", 4 * x.size, ms, rows, args.reps)
    x, dy = (gpu.from_numpy(g.standard_normal((rows_n, c)).astype(np.float32)) for _ in range(2))
    w = gpu.from_numpy(np.ones(c, np.float32))
    _, mean, rstd = gpu.layernorm_forward(x, w, w, 1e-5)
    ms, rows = timed(gpu, lambda: gpu.layernorm_backward(dy, x, w, mean, rstd), args.reps)
    report(f"layernorm_backward ({rows_n}, {c})", 4 * 3 * rows_n * c, ms, rows, args.reps)


if __name__ == "__main__":
    main()
