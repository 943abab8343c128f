"""Tensor-core matmul speed (precision "high", matmul/tensor.py) against the float32 kernels, per shape: every
TENSOR_CONFIGS candidate and the float32 candidates timed as the autotuner times them, TFLOP/s of the best.

    TINYNN_WEBGPU=dawn python experiments/tensor_matmul.py [--shapes 4096x4096x4096,2048x3072x768t ...]

A shape is MxNxK, with t after it for b stored transposed (a linear layer's forward) and a T before it for a
stored transposed (a weight gradient)."""
import argparse

import numpy as np

from tinynn import precision, registry

SHAPES = "4096x4096x4096,2048x3072x768t,2048x768x3072,2048x768x768t,T768x3072x2048,T768x768x2048,2048x2304x768t"


def parse(shape):
    ta = shape.startswith("T")
    tb = shape.endswith("t")
    m, n, k = (int(x) for x in shape.strip("Tt").split("x"))
    return m, n, k, ta, tb


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--float32", action="store_true", help="time the float32 candidates too")
    args = parser.parse_args()
    gpu = registry.select("gpu")
    precision.set_matmul_precision("high")
    print(gpu.describe()["matmul_precision"], flush=True)
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        m, n, k, ta, tb = parse(shape)
        a = gpu.from_numpy(rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32))
        b = gpu.from_numpy(rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32))
        out = gpu.rt.empty((m, n))
        names = gpu.mm.tensor_candidates + (gpu.mm.candidates if args.float32 else [])
        times = gpu.mm.time_variants((a, b, out, 1, m, n, k, ta, tb, False), names)
        flops = 2 * m * n * k
        ranked = sorted(times, key=times.get)
        print(f"{shape}: " + ", ".join(f"{name} {flops / times[name] / 1e9:.1f}" for name in ranked[:6])
              + " TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
