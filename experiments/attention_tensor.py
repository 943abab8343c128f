"""The attention forward on tensor cores (matmul precision "high", ops/attention_tensor.py) against the float32
kernels, at GPT-2's attention shape (B 4, nh 12, T 1024, hs 64) and the big config's (B 8, nh 12, T 256, hs 64):
each precision's error against the float64 NumPy reference, then GPU milliseconds (timestamps, dispatches back
to back in one pass: Runtime.time_pass) and TFLOP/s of the forward and of the backward (on tensor cores too in
"high", where a backward tile takes the head size; else float32). FLOPs count the causal half of the products:
the forward's two 4 B nh T^2 hs / 2, the backward's five (S again, dP, dV, dQ, dK) 2.5 times that. The GPU is kept busy first
(an idle GPU clocks down). In "high" the tensor-core kernels run as if chosen (ops/attention_choice.py); then,
with autotuning on (the default on a GPU), the backend's own choice is made afresh, timing both paths each way
(a "tuning kernels" line on stderr), and the row "chosen" says what it took, timed, and times it: it should
match the faster of the "highest" and "high" rows, each way. With tensor cores, the tensor-core forward is then
timed with each tile of --tiles that fits (QUERIESxKEYSxTHREADS; attention_tensor.TENSOR_TILES' order comes from
here).

    TINYNN_WEBGPU=dawn python experiments/attention_tensor.py [--reps 20] [--shapes gpt2,big] [--tiles 64x32x128,...]
"""
import argparse

import numpy as np

from tinynn import backends, precision, registry
from tinynn_gpu.ops.attention_choice import TENSOR, key
from tinynn_gpu.ops.attention_tensor import TensorTile

from attention_tiles import case, heat, rel_err  # experiments/, this script's folder

TILES = "64x32x128,32x32x128,64x16x128,32x32x64,32x16x64"
SHAPES = {"gpt2": (4, 1024, 12, 64), "big": (8, 256, 12, 64),  # (B, T, n_head, head size)
          "tiny": (1, 100, 2, 64)}  # for a try on a software adapter (--shapes tiny)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--shapes", default="gpt2,big")
    parser.add_argument("--tiles", default=TILES, help="tensor-core tiles to time, QUERIESxKEYSxTHREADS")
    parser.add_argument("--heat", type=float, default=2.0, help="seconds of GPU work before each timing")
    args = parser.parse_args()
    gpu, ref = registry.select("gpu"), backends.reference()
    usable, why = gpu.mm.tensor_cores()
    print(f"{gpu.device_name}: tensor cores {'yes' if usable else 'no (' + why + ')'}", flush=True)
    if usable:  # the attention kernels' own first-use check (ops/attention_tensor_check.py), per head size
        for hs in sorted({SHAPES[label][3] for label in args.shapes.split(",")}):
            usable = gpu.attention.tensor_cores(hs) and usable
        print(f"attention: {gpu.attention.describe()}", flush=True)
    for label in args.shapes.split(","):
        batch, seq, n_head, hs = SHAPES[label]
        scale = hs ** -0.5
        d_qkv, d_grad, y_ref, lse_ref, g_ref = case(gpu, ref, SHAPES[label])
        forward_flops = 2 * batch * n_head * seq * seq * hs
        keys = [key(direction, d_qkv.shape, n_head) for direction in ("forward", "backward")]
        for name in ("highest", "high", "chosen"):
            precision.set_matmul_precision("highest" if name == "highest" else "high")
            for k in keys:  # "high": the tensor-core kernels; "chosen": the choice made again, timed
                gpu.mm.choices.pop(k, None)
                if name == "high":
                    gpu.mm.choices[k] = TENSOR
            y, lse = gpu.attention_forward(d_qkv, n_head, scale)
            g_qkv = gpu.attention_backward(d_grad, d_qkv, y, lse, n_head, scale)
            errors = (rel_err(gpu.to_numpy(y), y_ref), float(np.abs(gpu.to_numpy(lse) - lse_ref).max()),
                      rel_err(gpu.to_numpy(g_qkv), g_ref))
            backward_tile = gpu.attention.tensor_backward.tile(d_qkv.shape, n_head)
            ran = f"tensor cores: forward tile {gpu.attention.tensor.tile(hs)}, backward tile {backward_tile}" \
                if name == "high" and usable else "float32" if not usable or name == "highest" else \
                ", ".join(f"{k.split()[2]} {gpu.mm.choices.get(k)}{' timed' * (k in gpu.mm.timed)}" for k in keys)
            heat(gpu, args.heat)
            forward = gpu.rt.time_pass(lambda: gpu.attention_forward(d_qkv, n_head, scale), args.reps)
            backward = gpu.rt.time_pass(lambda: gpu.attention_backward(d_grad, d_qkv, y, lse, n_head, scale),
                                        args.reps)
            print(f"{label} B{batch} nh{n_head} T{seq} hs{hs} {name:7s} ({ran}): forward {forward:.3f} ms "
                  f"{forward_flops / forward / 1e9:.1f} TFLOP/s, backward {backward:.3f} ms "
                  f"{2.5 * forward_flops / backward / 1e9:.1f} TFLOP/s; errors: y {errors[0]:.1e}, "
                  f"lse {errors[1]:.1e} (absolute), g_qkv {errors[2]:.1e}", flush=True)
        if usable:
            tile_rows(gpu, args, label, d_qkv, n_head, scale, forward_flops, y_ref)
    precision.set_matmul_precision(None)


def tile_rows(gpu, args, label, d_qkv, n_head, scale, flops, y_ref):
    """The tensor-core forward with each tile of --tiles that fits: error and time."""
    kernel = gpu.attention.tensor
    batch, seq, c3 = d_qkv.shape
    hs = c3 // 3 // n_head
    for tile in (TensorTile(*(int(n) for n in t.split("x"))) for t in args.tiles.split(",") if t):
        why = tile.check(hs, kernel.max_bytes)
        if why:
            print(f"{label} tile {tile}: {why}")
            continue
        y, lse = gpu.rt.empty((batch, seq, n_head * hs)), gpu.rt.empty((batch, n_head, seq))
        kernel.forward(d_qkv, y, lse, n_head, scale, tile)
        err = rel_err(gpu.to_numpy(y), y_ref)
        heat(gpu, args.heat / 2)
        ms = gpu.rt.time_pass(lambda: kernel.forward(d_qkv, y, lse, n_head, scale, tile), args.reps)
        print(f"{label} tile {tile}: forward {ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s, y error {err:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
