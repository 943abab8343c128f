"""PyTorch's side of the comparison, kernel by kernel (needs torch with CUDA; run on the device):

    python experiments/torch_kernels.py path/to/torch_gpt_reference.py [--configs lesson,big]

1. cuBLAS fp32 (TF32 off) time per matmul for the step shapes of the lesson, mid and big configs, and 4096^2: 50
   back-to-back calls between CUDA events, as `Runtime.time_pass` times ours (experiments/matmul_shapes.py).
2. GPU kernel time per training step of the reference model (eager, fused AdamW, scaled_dot_product_attention:
   the kernels its CUDA graph replays), by category and the largest kernels, from torch.profiler.
"""
import argparse
import collections
import importlib.util

import torch
from torch.profiler import ProfilerActivity, profile

# (M, N, K, A stored transposed, B stored transposed): the lesson step's, the mid one's, then the big one's,
# then 4096^2
SHAPES = [(2048, 1024, 256, 0, 1), (2048, 256, 1024, 0, 1), (2048, 256, 256, 0, 1), (2048, 768, 256, 0, 1),
          (2048, 1024, 256, 0, 0), (1024, 256, 2048, 1, 0), (256, 256, 2048, 1, 0), (2048, 256, 768, 0, 0),
          (768, 256, 2048, 1, 0),
          (2048, 1152, 384, 0, 1), (2048, 384, 384, 0, 1), (2048, 1536, 384, 0, 1), (2048, 384, 1536, 0, 1),
          (2048, 384, 1152, 0, 0), (2048, 384, 384, 0, 0), (2048, 1536, 384, 0, 0), (2048, 384, 1536, 0, 0),
          (1152, 384, 2048, 1, 0), (384, 384, 2048, 1, 0), (1536, 384, 2048, 1, 0), (384, 1536, 2048, 1, 0),
          (2048, 3072, 768, 0, 1), (768, 3072, 2048, 1, 0), (2048, 768, 3072, 0, 0),
          (4096, 4096, 4096, 0, 0)]
CATEGORIES = (("matmul", ("gemm", "cutlass", "xmma", "cublas")), ("attention", ("fmha", "flash", "attention")),
              ("layernorm", ("layer_norm", "gammabeta")), ("optimizer", ("adam", "multi_tensor", "norm")),
              ("reduce", ("reduce",)), ("loss", ("nll", "log_softmax")))


def category(kernel: str) -> str:
    name = kernel.lower()
    return next((c for c, words in CATEGORIES if any(w in name for w in words)), "elementwise/other")


def time_matmuls():
    torch.backends.cuda.matmul.allow_tf32 = False
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(30):  # clocks up
        x @ x
    for m, n, k, ta, tb in SHAPES:
        a = torch.randn((k, m) if ta else (m, k), device="cuda")
        b = torch.randn((n, k) if tb else (k, n), device="cuda")
        a, b = (a.t() if ta else a), (b.t() if tb else b)
        for _ in range(5):
            a @ b
        start.record()
        for _ in range(50):
            a @ b
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) / 50 * 1e3
        print(f"cuBLAS {m}x{n}x{k} ta={ta} tb={tb}: {us:7.1f} us {2 * m * n * k / us / 1e6:5.1f} TFLOP/s", flush=True)


def profile_step(reference, name, steps=5):
    cfg = reference.CONFIGS[name]
    torch.manual_seed(0)
    model = reference.GPT(cfg["vocab"], cfg["block"], cfg["n_embd"], cfg["n_head"], cfg["n_layer"], True).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["block"]), device="cuda")

    def step():
        loss = model(idx, idx)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss
    for _ in range(20):
        step().item()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step().item()
    us, calls, by_category = collections.Counter(), collections.Counter(), collections.Counter()
    for event in prof.key_averages():
        if event.device_time_total > 0:
            us[event.key] += event.device_time_total / steps
            calls[event.key] += event.count / steps
            by_category[category(event.key)] += event.device_time_total / steps
    print(f"== PyTorch {name}: GPU kernel time {sum(us.values()) / 1e3:.3f} ms per step, "
          f"{sum(calls.values()):.0f} kernels")
    for cat, t in by_category.most_common():
        print(f"   {cat:<18} {t / 1e3:7.3f} ms")
    for kernel, t in us.most_common(12):
        print(f"   {calls[kernel]:4.0f} x {t / calls[kernel]:7.1f} us = {t / 1e3:6.3f} ms  {kernel[:80]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("reference", help="torch_gpt_reference.py")
    parser.add_argument("--configs", default="lesson,big")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("torch_gpt_reference", args.reference)
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    time_matmuls()
    for name in args.configs.split(","):
        profile_step(reference, name)


if __name__ == "__main__":
    main()
