"""The attention forward on tensor cores (matmul precision "high", ops/attention_tensor.py) against the float32
kernels, at GPT-2's attention shape (B 4, nh 12, T 1024, hs 64) and the big config's (B 8, nh 12, T 256, hs 64):
each precision's error against the float64 NumPy reference, then GPU milliseconds (timestamps, dispatches back
to back in one pass: Runtime.time_pass) and TFLOP/s of the forward and of the backward (float32 in both: it
takes the forward's y and logsumexp). FLOPs count the causal half of the products: the forward's two
4 B nh T^2 hs / 2, the backward's five (S again, dP, dV, dQ, dK) 2.5 times that. The GPU is kept busy first
(an idle GPU clocks down).

    TINYNN_WEBGPU=dawn python experiments/attention_tensor.py [--reps 20] [--shapes gpt2,big]
"""
import argparse
import time

import numpy as np

from tinynn import backends, precision, registry

SHAPES = {"gpt2": (4, 1024, 12, 64), "big": (8, 256, 12, 64),  # (B, T, n_head, head size)
          "tiny": (1, 100, 2, 64)}  # for a try on a software adapter (--shapes tiny)


def heat(gpu, seconds):
    """Keep the GPU busy for `seconds`: its clocks rise from idle only under load."""
    a = gpu.from_numpy(np.ones((1024, 1024), np.float32))
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            gpu.matmul(a, a)
        gpu.rt.sync()


def rel_err(actual, expected):
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--shapes", default="gpt2,big")
    parser.add_argument("--heat", type=float, default=2.0, help="seconds of GPU work before each timing")
    args = parser.parse_args()
    gpu, ref = registry.select("gpu"), backends.reference()
    usable, why = gpu.mm.tensor_cores()
    print(f"{gpu.device_name}: tensor cores {'yes' if usable else 'no (' + why + ')'}", flush=True)
    for label in args.shapes.split(","):
        batch, seq, n_head, hs = SHAPES[label]
        g = np.random.default_rng(0)
        qkv = g.standard_normal((batch, seq, 3 * n_head * hs)).astype(np.float32)
        grad = g.standard_normal((batch, seq, n_head * hs)).astype(np.float32)
        scale = hs ** -0.5
        y_ref, lse_ref = ref.attention_forward(qkv.astype(np.float64), n_head, scale)
        g_ref = ref.attention_backward(grad.astype(np.float64), qkv.astype(np.float64), y_ref, lse_ref, n_head, scale)
        d_qkv, d_grad = gpu.from_numpy(qkv), gpu.from_numpy(grad)
        forward_flops = 2 * batch * n_head * seq * seq * hs
        for name in ("highest", "high"):
            precision.set_matmul_precision(name)
            y, lse = gpu.attention_forward(d_qkv, n_head, scale)
            g_qkv = gpu.attention_backward(d_grad, d_qkv, y, lse, n_head, scale)
            errors = (rel_err(gpu.to_numpy(y), y_ref), float(np.abs(gpu.to_numpy(lse) - lse_ref).max()),
                      rel_err(gpu.to_numpy(g_qkv), g_ref))
            ran = f"tensor cores, tile {gpu.attention.tensor.tile(hs)}" if name == "high" and usable else "float32"
            heat(gpu, args.heat)
            forward = gpu.rt.time_pass(lambda: gpu.attention_forward(d_qkv, n_head, scale), args.reps)
            backward = gpu.rt.time_pass(lambda: gpu.attention_backward(d_grad, d_qkv, y, lse, n_head, scale),
                                        args.reps)
            print(f"{label} B{batch} nh{n_head} T{seq} hs{hs} {name:7s} ({ran}): forward {forward:.3f} ms "
                  f"{forward_flops / forward / 1e9:.1f} TFLOP/s, backward {backward:.3f} ms "
                  f"{2.5 * forward_flops / backward / 1e9:.1f} TFLOP/s; errors: y {errors[0]:.1e}, "
                  f"lse {errors[1]:.1e} (absolute), g_qkv {errors[2]:.1e}", flush=True)
    precision.set_matmul_precision(None)


if __name__ == "__main__":
    main()
