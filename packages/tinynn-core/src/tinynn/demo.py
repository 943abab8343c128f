"""`tinynn demo`: four short demonstrations, each runnable on its own (tinynn demo 2).

1. tensors and autograd, checked against finite differences;
2. an MLP learning a generated two-spirals dataset;
3. a tiny GPT trained a few steps on the embedded corpus, then sampling;
4. the GPU check: a GPU backend's kernels against the CPU reference, and their speed.
"""
from __future__ import annotations

import tempfile
import time

import numpy as np

import tinynn
from tinynn import registry, rng
from tinynn import functional as F
from tinynn.config import TrainConfig
from tinynn.nn import Linear, Module
from tinynn.optim import AdamW
from tinynn.train import train


def demo_autograd(out=print):
    """-> (dy/dw from the backward pass, dy/dw from finite differences), each a list of w's three entries."""
    out("demo 1: tensors and autograd")
    x = tinynn.tensor(np.array([[0.5, -1.0, 2.0]]), requires_grad=True)
    w = tinynn.tensor(np.array([[0.1], [0.2], [-0.3]]), requires_grad=True)
    y = (x @ w).tanh().sum()
    y.backward()
    out(f"  y = tanh(x @ w) = {y.item():.6f}")
    out(f"  dy/dw = {w.grad.numpy().ravel().round(6).tolist()}")
    eps, numeric = 1e-3, []
    for i in range(3):
        wp, wm = w.numpy().copy(), w.numpy().copy()
        wp[i, 0] += eps
        wm[i, 0] -= eps
        numeric.append((np.tanh(x.numpy() @ wp).sum() - np.tanh(x.numpy() @ wm).sum()) / (2 * eps))
    out(f"  finite differences = {np.round(numeric, 6).tolist()}")
    return w.grad.numpy().ravel().tolist(), [float(n) for n in numeric]


class MLP(Module):
    def __init__(self, sizes):
        self.layers = [Linear(a, b, std=1.0 / np.sqrt(a)) for a, b in zip(sizes[:-1], sizes[1:])]

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)


def two_spirals(n_per_class: int, seed: int):
    """Two interleaved spirals in 2-D with a little noise: a classic that a linear model cannot separate."""
    g = np.random.default_rng(seed)
    t = np.sqrt(g.random(n_per_class)) * 3 * np.pi
    arm = np.stack([t * np.cos(t), t * np.sin(t)], axis=1) / (3 * np.pi)
    x = np.concatenate([arm, -arm]) + g.normal(0, 0.02, (2 * n_per_class, 2))
    y = np.concatenate([np.zeros(n_per_class), np.ones(n_per_class)]).astype(np.int64)
    return x.astype(np.float32), y


def demo_mlp(out=print, steps=400):
    """-> the fraction of the points classified right after training."""
    out("demo 2: an MLP learning two spirals")
    rng.manual_seed(0)
    x, y = two_spirals(200, seed=0)
    model = MLP([2, 64, 64, 2])
    opt = AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
    xt = tinynn.tensor(x)
    for step in range(steps):
        loss = F.cross_entropy(model(xt), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            out(f"  step {step:4d}  loss {loss.item():.4f}")
    accuracy = float((model(xt).numpy().argmax(axis=1) == y).mean())
    out(f"  accuracy on {len(y)} points: {accuracy:.1%}")
    return accuracy


def demo_gpt(out=print, steps=60, progress=True):
    """-> the run's TrainResult (its losses, its sample). Its training shows a progress bar (on stderr): seconds
    on a CPU, and more on a GPU's first use, while kernels compile."""
    out("demo 3: a tiny GPT on the embedded corpus")
    with tempfile.TemporaryDirectory(prefix="tinynn-demo-") as out_dir:
        cfg = TrainConfig(block_size=32, n_layer=2, n_head=2, n_embd=64, batch_size=16, max_steps=steps,
                          learning_rate=3e-3, min_lr=3e-4, warmup_steps=10, eval_interval=steps, eval_steps=4,
                          checkpoint_interval=0, out_dir=out_dir, sample_tokens=120)
        result = train(cfg, device=registry.default(), progress=progress)
    h = result.history
    out(f"  loss {h['train_loss'][0]:.3f} -> {h['train_loss'][-1]:.3f} in {steps} steps")
    out("  sample: " + result.sample.replace("\n", "\n          "))
    return result


def demo_gpu(out=print, size=512):
    """-> the timings and the checks against the CPU, or None when there is no GPU to check."""
    out("demo 4: GPU check")
    gpu = registry.default()
    if not gpu.is_gpu:
        out(f"  skipped: running on the CPU ({registry.why_not_gpu() or 'the CPU was asked for'})")
        return None
    cpu, g = registry.reference(), np.random.default_rng(0)
    out(f"  device: {gpu.device_name} ({gpu.name})")
    a, b = g.standard_normal((size, size), dtype=np.float32), g.standard_normal((size, size), dtype=np.float32)

    def best_ms(fn, repeat=5):
        fn()  # warm-up: pipeline compilation, buffer allocation
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return 1e3 * min(times)

    t_cpu = best_ms(lambda: cpu.matmul(a, b))
    t_round = best_ms(lambda: gpu.to_numpy(gpu.matmul(gpu.from_numpy(a), gpu.from_numpy(b))))
    da, db = gpu.from_numpy(a), gpu.from_numpy(b)
    t_resident = best_ms(lambda: [gpu.matmul(da, db) for _ in range(10)] and gpu.sync()) / 10
    ba, bb = g.standard_normal((4, 67, 45), dtype=np.float32), g.standard_normal((4, 45, 33), dtype=np.float32)
    err = float(np.abs(gpu.to_numpy(gpu.matmul(gpu.from_numpy(ba), gpu.from_numpy(bb))) - ba @ bb).max())
    v, w = g.standard_normal(10_000, dtype=np.float32), g.standard_normal(10_000, dtype=np.float32)
    dv, dw = gpu.from_numpy(v), gpu.from_numpy(w)
    checks = {
        "scale": np.allclose(gpu.to_numpy(gpu.scalar("mul", dv, 2.5)), v * 2.5, rtol=1e-6),
        "relu": np.array_equal(gpu.to_numpy(gpu.unary("relu", dv)), np.maximum(v, 0)),
        "add": np.allclose(gpu.to_numpy(gpu.binary("add", dv, dw)), v + w, rtol=1e-6),
    }
    mm = f"{size}x{size} matmul"
    rows = [(f"{mm}, CPU (NumPy)", f"{t_cpu:.3f} ms"),
            (f"{mm}, GPU incl. upload + read back", f"{t_round:.3f} ms ({speedup(t_cpu, t_round)})"),
            (f"{mm}, GPU data resident", f"{t_resident:.3f} ms ({speedup(t_cpu, t_resident)})"),
            ("batched matmul (4x67x45 @ 4x45x33) max abs error", f"{err:.2e}"),
            ("elementwise scale / relu / add", " / ".join("ok" if v else "FAILED" for v in checks.values()))]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        out(f"  {name:<{width}}  {value}")
    return {"cpu_ms": t_cpu, "gpu_roundtrip_ms": t_round, "gpu_resident_ms": t_resident, "max_abs_error": err,
            "elementwise_ok": all(checks.values())}


def speedup(t_cpu: float, t_gpu: float) -> str:
    """The CPU's time over the GPU's, with two significant digits below 1 (a slow software adapter)."""
    ratio = t_cpu / t_gpu
    return f"{ratio:.1f}x" if ratio >= 1 else f"{ratio:.2g}x"


DEMOS = {1: demo_autograd, 2: demo_mlp, 3: demo_gpt, 4: demo_gpu}


def run(which=None, out=print):
    for number in which or sorted(DEMOS):
        DEMOS[number](out=out)
        out("")
