"""The training step's kernels besides the matmuls, on a config's real shapes: each op timed as `reps`
back-to-back calls in one compute pass (Runtime.time_pass: the barriers between dispatches counted as in a
step, none of the per-dispatch timestamps of `--profile`), against the time its bytes take at memory speed.

    python experiments/row_kernels.py [--config apps/bench/lesson.json] [--reps 50]
        [--bandwidth 4.0e12] [--group-cols 4,8,16] [--row-values 4x8,4x4,1x8]

Bytes are what the op must read and write once (its inputs and outputs); `floor` is an empty dispatch's
time (a fill of 1 float), the barrier each dispatch pays whatever it does. --group-cols times LayerNorm's
backward with each column-workgroup width (backend.LAYERNORM_GROUP_COLS, where the backend has it), each
width first checked against the NumPy reference (the other ops are the shipped kernels, which the test suite
checks); --row-values times LayerNorm again with each (width, step) of layernorm.wgsl's Values given.
"""
import argparse
import math
import time

import numpy as np

from tinynn import backends, config, registry
from tinynn.model import GPT
from tinynn_gpu.ops import group_sum
from tinynn_gpu.ops import layernorm as layernorm_ops

VOCAB = 65  # tinynn bench's vocabulary


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="apps/bench/lesson.json")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--bandwidth", type=float, default=4.0e12, help="bytes/s the memory-speed bound uses")
    parser.add_argument("--group-cols", default="4,8,16", help="columns (not Values), 0 for the shipped widths")
    parser.add_argument("--row-values", default="",
                        help="LayerNorm also with these (width, step) of group_sum.row_values, e.g. 4x8,4x4,1x8")
    args = parser.parse_args()
    gpu = registry.select("gpu")
    cfg = config.load(args.config)
    b, t, c, h = cfg.batch_size, cfg.block_size, cfg.n_embd, cfg.n_head
    n = b * t
    rng = np.random.default_rng(0)

    def up(*shape, scale=1.0):
        return gpu.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32))

    def timed(fn):
        fn()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.2:  # clocks up before the timed pass
            fn()
            gpu.sync()
        return gpu.rt.time_pass(fn, args.reps) * 1e3  # us per call

    rows = []

    def row(name, fn, nbytes, dispatches):
        us = timed(fn)
        bound = nbytes / args.bandwidth * 1e6
        rows.append((name, us, nbytes, bound, dispatches))
        print(f"{name:<44} {us:8.2f} us  {dispatches} disp  {nbytes / 1e6:7.2f} MB  "
              f"{nbytes / us / 1e3:7.0f} GB/s  bound {bound:6.2f} us", flush=True)

    print(f"{gpu.device_name}, subgroups {'subgroup' in gpu.ctx.features}; {args.config}: N={n} C={c} H={h}")
    tiny = gpu.from_numpy(np.zeros(1, np.float32))
    row("floor: fill of 1 float", lambda: gpu._fill(tiny, 0.0), 4, 1)

    x, gy, g_add = up(n, c), up(n, c), up(n, c)
    w, bias = up(c), up(c)
    _, mean, rstd = gpu.layernorm_forward(x, w, bias, 1e-5)
    cpu = backends.reference()
    host = [None if a is None else gpu.to_numpy(a) for a in (gy, x, w, mean, rstd, g_add)]
    expected = cpu.layernorm_backward(*host[:5], True, host[5])
    expected_y = cpu.layernorm_forward(*host[1:3], gpu.to_numpy(bias), 1e-5)[0]
    shipped = getattr(group_sum, "row_values", None)
    shipped_cols = getattr(layernorm_ops, "GROUP_COLS", None)
    values = [None] + [tuple(int(v) for v in pick.split("x")) for pick in args.row_values.split(",") if pick]
    for chosen in values if shipped else [None]:
        label = "" if chosen is None else f" values {chosen[0]}x{chosen[1]}"
        if chosen is not None:
            group_sum.row_values = lambda cols, chosen=chosen: chosen
            gpu.rt.launches.clear()  # the forward keeps its launch by shape
        err = np.abs(gpu.to_numpy(gpu.layernorm_forward(x, w, bias, 1e-5)[0]) - expected_y).max()
        if not err < 1e-4 * np.abs(expected_y).max():
            raise SystemExit(f"layernorm_forward{label}: off by {err:.1e}")
        row(f"layernorm_forward ({n}, {c}){label}", lambda: gpu.layernorm_forward(x, w, bias, 1e-5),
            4 * (2 * n * c + 2 * n + 2 * c), 1)
        for width in [int(v) for v in args.group_cols.split(",")] if shipped_cols else [0]:
            if shipped_cols:
                layernorm_ops.GROUP_COLS = {1: {0: width}, 4: {0: width}} if width else shipped_cols
            got = gpu.layernorm_backward(gy, x, w, mean, rstd, True, g_add)
            for name, o, e in zip(("g_x", "g_weight", "g_bias"), got, expected):
                err = np.abs(gpu.to_numpy(o) - e).max() / max(np.abs(e).max(), 1e-30)
                if not err < 1e-4:
                    raise SystemExit(f"layernorm_backward with {width or 'the shipped'} columns a workgroup{label}: "
                                     f"{name} off by {err:.1e}")
            row(f"layernorm_backward +g_add ({n}, {c}) cols/wg {width or 'shipped'}{label}",
                lambda: gpu.layernorm_backward(gy, x, w, mean, rstd, True, g_add), 4 * (4 * n * c + 2 * n + 3 * c), 1)
    if shipped:
        group_sum.row_values = shipped
        gpu.rt.launches.clear()
    if shipped_cols:
        layernorm_ops.GROUP_COLS = shipped_cols

    qkv = up(b, t, 3 * c)
    y, lse = gpu.attention_forward(qkv, h, 1 / math.sqrt(c // h))
    attn_disp = _count(gpu, lambda: gpu.attention_forward(qkv, h, 1 / math.sqrt(c // h)))
    row(f"attention_forward ({b}, {t}, {3 * c})", lambda: gpu.attention_forward(qkv, h, 1 / math.sqrt(c // h)),
        4 * (4 * n * c + b * h * t), attn_disp)
    gy2 = up(b, t, c)
    back_disp = _count(gpu, lambda: gpu.attention_backward(gy2, qkv, y, lse, h, 1 / math.sqrt(c // h)))
    row("attention_backward", lambda: gpu.attention_backward(gy2, qkv, y, lse, h, 1 / math.sqrt(c // h)),
        4 * (8 * n * c + 2 * b * h * t), back_disp)

    logits = up(n, VOCAB, scale=2.0)
    targets = gpu.from_numpy(rng.integers(0, VOCAB, n).astype(np.int32))
    loss, probs, count = gpu.cross_entropy_forward(logits, targets, -100)
    row(f"cross_entropy_forward ({n}, {VOCAB})", lambda: gpu.cross_entropy_forward(logits, targets, -100),
        4 * (2 * n * VOCAB + 3 * n), 2)
    g_loss = gpu.from_numpy(np.ones((), np.float32))
    row("cross_entropy_backward", lambda: gpu.cross_entropy_backward(probs, targets, g_loss, -100, count),
        4 * (2 * n * VOCAB + n), 1)

    wte, wpe = up(VOCAB, c), up(t, c)
    idx = gpu.from_numpy(rng.integers(0, VOCAB, (b, t)).astype(np.int32))
    row("embedding_with_positions_forward", lambda: gpu.embedding_with_positions_forward(wte, wpe, idx),
        4 * (n * c + n + (VOCAB + t) * c), 1)
    row("embedding_with_positions_backward",
        lambda: gpu.embedding_with_positions_backward(gy, idx, VOCAB, cfg.block_size),
        4 * (n * c + n + (VOCAB + t) * c), 1)

    h4 = up(n, 4 * c)
    row(f"unary gelu ({n}, {4 * c}) (elementwise reference)", lambda: gpu.unary("gelu", h4), 8 * n * 4 * c, 1)
    row(f"sum over rows ({n}, {c})", lambda: gpu.sum(x, (0,)), 4 * (n * c + c), 1)

    shapes = [p.shape for p in GPT(cfg.model_config(VOCAB)).parameters()]
    total = sum(int(np.prod(s)) for s in shapes)
    params, grads, ms, vs = ([up(*s) for s in shapes] for _ in range(4))
    vs = [gpu.unary("relu", v) for v in vs]
    norm_disp = _count(gpu, lambda: gpu.global_norm_and_clip(grads, 1.0))
    row(f"global_norm_and_clip ({len(shapes)} tensors, {total / 1e6:.2f} M)",
        lambda: gpu.global_norm_and_clip(grads, 1.0), 4 * total, norm_disp)
    hyper = gpu.from_numpy(np.array([1e-4, 0.1, 0.01], np.float32))
    scale = gpu.from_numpy(np.array(0.5, np.float32))

    def adamw():
        gpu.adamw_update_(params, grads, ms, vs, hyper, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1,
                          grad_scale=scale)
    row("adamw_update_", adamw, 28 * total, _count(gpu, adamw))


def _count(gpu, fn):
    before = gpu.counters["dispatches"]
    fn()
    return gpu.counters["dispatches"] - before


if __name__ == "__main__":
    main()
