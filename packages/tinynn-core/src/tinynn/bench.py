"""`tinynn bench`: matmul throughput and training-step time, CPU against the active GPU backend.

Matmuls are timed with their data already on the device (the GPU's upload and read-back are not what a
training step pays); a training step is timed end to end, `loss.item()` included, as a training loop runs
it. With a GPU backend it also reports host syncs, dispatches and submissions per step, the host's
microseconds per dispatch (replayed in the training step, eager in an evaluation forward; and a submit
thread's, where the backend has one), the peak memory of a step, NumPy fallbacks, and (`--profile`, where
the adapter has timestamp queries) GPU time per kernel. A progress line on stderr names the work under way
(a GPU's first steps compile kernels and tune matmuls); the flags are checked before any of it.

    tinynn bench                     # matmul 256..4096 and the lesson config's step, CPU and GPU
    tinynn bench --json --sizes 512,1024 --steps 30
    tinynn bench --device gpu --no-cpu --sizes "" --config apps/bench/big.json   # the GPU step alone
    tinynn bench --device gpu --no-cpu --sizes "" --config apps/bench/gpt2.json  # GPT-2 small, vocab 50257 (50304)

The timed model is the config's, its vocabulary the config's `vocab_size` (a bpe tokenizer's; gpt2.json's is
GPT-2's), else the 65 characters of the reference's Shakespeare; the batches are random ids below it.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np
from tqdm.auto import tqdm

from tinynn import memory, registry, rng
from tinynn.config import TrainConfig
from tinynn.errors import TinynnError
from tinynn.model import GPT, GPTConfig
from tinynn.optim import AdamW, decay_groups
from tinynn.tensor import Tensor, no_grad
from tinynn.train_step import TrainStep

# The lesson's scale, timed when no config is given: the lesson's model (GPTConfig's defaults, which
# apps/chargpt/lesson.json and apps/bench/lesson.json train) and its batch (a training config's default)
LESSON = {**{key: getattr(GPTConfig(), key) for key in ("block_size", "n_layer", "n_head", "n_embd")},
          "batch_size": TrainConfig.batch_size}
VOCAB = GPTConfig().vocab_size  # the reference's vocabulary (Shakespeare's characters), unless a config has one


# Seconds of load before timing on a GPU: an idle GPU lowers its clock within a second (while the host compiles
# shaders, say) and needs up to about 2 s of load to raise it again, so shorter warm-ups time a slowed GPU.
GPU_WARMUP_SECONDS = 2.0


def time_call(fn, sync, min_seconds=0.3, max_reps=50, warmup_seconds=GPU_WARMUP_SECONDS) -> float:
    """Seconds per call: warm-up calls for warmup_seconds (GPU_WARMUP_SECONDS), then as many calls as fit in
    min_seconds (at least 2)."""
    t0 = time.perf_counter()
    while True:
        fn()
        sync()
        if time.perf_counter() - t0 >= warmup_seconds:
            break
    reps, t0 = 0, time.perf_counter()
    while reps < 2 or (time.perf_counter() - t0 < min_seconds and reps < max_reps):
        fn()
        reps += 1
        if reps in (2, 5, 10):
            sync()  # a GPU backend only records; let the queue drain now and then
    sync()
    return (time.perf_counter() - t0) / reps


# Float32 n x n matrices a size holds at once: a and b on the host, their copies on the device (the same arrays
# on the CPU), the product, and the NumPy product it is checked against
MATMUL_COPIES = 5


def parse_sizes(text: str) -> list[int]:
    """--sizes: matrix sizes, comma-separated ("" for none: the training step alone). Each is checked here,
    and against the memory available, before any timing starts."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not (part.isdigit() and int(part) >= 1):
            raise TinynnError(f"--sizes takes whole numbers of at least 1, comma-separated; got {part!r} in {text!r}")
        sizes.append(int(part))
    available = memory.available_bytes()
    for n in sizes:
        need = MATMUL_COPIES * memory.FLOAT * n * n
        if available is not None and need > available:
            raise TinynnError(f"--sizes {n} needs about {memory.gib(need)} of memory, only "
                              f"{memory.gib(available)} is available: take smaller sizes")
    return sizes


def check_steps(steps: int) -> int:
    if steps < 1:
        raise TinynnError(f"--steps must be at least 1 (the timed training steps), got {steps}")
    return steps


def quiet() -> tqdm:
    """A progress bar that shows nothing, for callers that want none."""
    return tqdm(disable=True)


def bench_matmul(backend, sizes, bar=None) -> list[dict]:
    bar = quiet() if bar is None else bar
    g = np.random.default_rng(0)
    rows = []
    for n in sizes:
        bar.set_postfix_str(f"matmul {n}x{n}")
        a, b = (g.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        da, db = backend.from_numpy(a), backend.from_numpy(b)
        seconds = time_call(lambda: backend.matmul(da, db), backend.sync,
                            warmup_seconds=GPU_WARMUP_SECONDS if backend.is_gpu else 0.0)
        err = float(np.abs(backend.to_numpy(backend.matmul(da, db)) - a @ b).max()) if n <= 1024 else None
        rows.append({"size": n, "ms": seconds * 1e3, "gflops": 2 * n**3 / seconds / 1e9, "max_abs_err": err,
                     "kernel": backend.describe().get("matmul", "numpy")})
        bar.update()
    return rows


def vocabulary(cfg: TrainConfig) -> int:
    """The timed model's vocabulary: the config's vocab_size, else VOCAB."""
    return cfg.vocab_size or VOCAB


def lesson_step(backend, cfg: TrainConfig):
    """A seeded GPT, its AdamW and a TrainStep on `backend`, with one fixed batch to feed it."""
    rng.manual_seed(0)
    registry.set_default(backend)
    model = GPT(cfg.model_config(vocabulary(cfg)))
    opt = AdamW(decay_groups(list(model.named_parameters()), 0.1), lr=3e-4, max_grad_norm=1.0)
    x = np.random.default_rng(0).integers(0, vocabulary(cfg), (cfg.batch_size, cfg.block_size))
    return TrainStep(model, opt, cfg.batch_size, cfg.block_size), x


def bench_train(backend, cfg: TrainConfig, steps: int, bar=None) -> dict:
    bar = quiet() if bar is None else bar
    bar.set_postfix_str("training step: building the model")
    train_step, x = lesson_step(backend, cfg)
    recording = []

    def step():
        t0 = time.perf_counter()
        loss = train_step(x, x, 3e-4)
        recording.append(time.perf_counter() - t0)  # the host's share: the GPU may still be running
        return loss.item()  # one host sync per step, like a logging loop
    # warm-up: autotuning, caches, capture; on a GPU then GPU_WARMUP_SECONDS of steps as timed, the load that raises
    # its clocks (counted from the first steps' end: their compiles and tuning can outlast it)
    warm_steps, warm_seconds = (6, GPU_WARMUP_SECONDS) if backend.is_gpu else (1, 0.0)
    first_use = " (kernels compile and matmuls tune on first use)" if backend.is_gpu else ""
    bar.set_postfix_str("training step: warm-up" + first_use)
    for _ in range(warm_steps):
        step()
    while getattr(backend, "tuning_pending", 0):  # a GPU backend tunes its matmuls between the first steps
        step()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_seconds:
        step()
    counters = getattr(backend, "counters", {})
    before = dict(counters)
    recording.clear()
    backend.memory_stats(reset_peak=True)
    bar.update()
    t0 = time.perf_counter()
    bar.set_postfix_str(f"training step: {steps} timed")
    for _ in range(steps):
        step()
        bar.update()
    seconds = (time.perf_counter() - t0) / steps
    per_step = {k: (counters[k] - before.get(k, 0)) / steps for k in counters}
    host_ms = 1e3 * sum(recording) / steps
    dispatches = per_step.get("dispatches")
    return {"steps": steps, "ms_per_step": seconds * 1e3, "host_ms_per_step": host_ms,
            "tokens_per_s": cfg.batch_size * cfg.block_size / seconds,
            "host_syncs_per_step": per_step.get("host_syncs"), "dispatches_per_step": dispatches,
            "submissions_per_step": per_step.get("submissions"),
            "host_us_per_replayed_dispatch": 1e3 * host_ms / dispatches if dispatches else None,
            # a backend that records on a worker thread (the GPU's replay records the next step there): that
            # thread's busy time, which overlaps the calling thread's (host_ms_per_step counts only the caller);
            # None when no thread worked in these steps (its counter outlives a thread that was closed)
            "record_thread_us_per_dispatch": per_step["record_thread_us"] / dispatches
            if dispatches and per_step.get("record_thread_us") else None,
            # and how long the caller waited for that thread's recording, per step (part of host_ms_per_step)
            "record_wait_us_per_step": per_step.get("record_wait_us", 0.0)
            if dispatches and per_step.get("record_thread_us") else None,
            "host_us_per_eager_dispatch": eager_dispatch_us(backend, train_step.model, x) if backend.is_gpu else None,
            "peak_memory_bytes": backend.memory_stats()["peak_bytes"], "fallbacks": dict(backend.fallbacks),
            "config": model_description(cfg)}


def model_description(cfg: TrainConfig) -> dict:
    """The timed model and batch: the lesson's keys, the vocabulary (and the rows that pad it) and the head."""
    model = cfg.model_config(vocabulary(cfg))
    return {**{k: getattr(cfg, k) for k in LESSON}, "vocab_size": model.vocab_size,
            "padded_vocab_size": model.padded_vocab_size, "tie_embeddings": model.tie_embeddings,
            "head_bias": model.bias and model.head_bias}


def eager_dispatch_us(backend, model, x, reps=10, warmup=3) -> float:
    """Host microseconds per dispatch of an evaluation forward (eager: evaluation is never replayed), each
    forward timed right after the read-back of the one before. The warm-up forwards run the same loop as the
    timed ones, so that the same arrays are alive across a forward (the last loss): otherwise the pool hands
    other buffers to the first timed forwards, which then pay for one-time work (new bind groups)."""
    inputs = [Tensor(backend.from_numpy(x), backend) for _ in range(2)]
    model.eval()
    with no_grad():
        seconds, dispatches = 0.0, 0
        for i in range(warmup + reps):
            if i == warmup:
                seconds, dispatches = 0.0, backend.counters["dispatches"]
            t0 = time.perf_counter()
            loss = model(*inputs)[1]
            seconds += time.perf_counter() - t0
            loss.item()
    model.train()
    return 1e6 * seconds / (backend.counters["dispatches"] - dispatches)


def profile_step(backend, cfg: TrainConfig) -> list[dict]:
    """GPU time per kernel over one training step (timestamp queries around each dispatch)."""
    if not hasattr(backend, "profile"):
        raise TinynnError(f"--profile needs a GPU backend with timestamp queries; {backend.name} has none")
    train_step, x = lesson_step(backend, cfg)
    train_step(x, x, 3e-4).item()  # warm-up; the profiled call is the second, still eager (not replayed)
    # then matmuls for GPU_WARMUP_SECONDS: building the model left the GPU idle, at a lowered clock
    a = backend.from_numpy(np.ones((1024, 1024), np.float32))
    time_call(lambda: backend.matmul(a, a), backend.sync, min_seconds=0.0, max_reps=1)
    return backend.profile(lambda: train_step(x, x, 3e-4).item())


def main(args) -> None:
    sizes, steps = parse_sizes(args.sizes), check_steps(args.steps)
    if args.config:
        from tinynn import config
        cfg = config.load(args.config)
    else:
        cfg = TrainConfig(**LESSON)
    active = registry.select(args.device)
    targets = ([] if args.no_cpu and active.is_gpu else [registry.reference()]) + ([active] if active.is_gpu else [])
    report = {"backends": {}}
    for be in targets:
        # on stderr, so that --json's stdout stays one document; gone once the backend's results print
        with tqdm(total=len(sizes) + 1 + steps, desc=f"bench ({be.name})", unit="task", leave=False,
                  file=sys.stderr, bar_format="{desc}: {n_fmt}/{total_fmt} {elapsed}{postfix}") as bar:
            entry = {"device": be.device_name, "matmul_precision": be.describe()["matmul_precision"],
                     "matmul": bench_matmul(be, sizes, bar),
                     "train_step": bench_train(be, cfg, steps, bar)}
            if args.profile and be.is_gpu:
                bar.set_postfix_str("profiling a training step")
                entry["profile"] = profile_step(be, cfg)
        report["backends"][be.name] = entry
        if not args.json:
            print_entry(be, entry)
    if args.json:
        print(json.dumps(report, indent=2))


def describe_config(config: dict) -> str:
    """The timed model and batch in words (model_description's): block 64, 4 layer(s), 4 head(s), n_embd 128,
    vocab 65, batch 16; GPT-2's: ..., vocab 50257 in 50304 rows, head tied to wte without bias, batch 4."""
    vocab, rows = config["vocab_size"], config["padded_vocab_size"]
    head = [words for words, on in (("tied to wte", config["tie_embeddings"]),
                                    ("without bias", not config["head_bias"])) if on]
    return (f"block {config['block_size']}, {config['n_layer']} layer(s), {config['n_head']} head(s), "
            f"n_embd {config['n_embd']}, vocab {vocab}" + (f" in {rows} rows" if rows != vocab else "")
            + (f", head {' '.join(head)}" if head else "") + f", batch {config['batch_size']}")


def print_entry(be, entry, out=print) -> None:
    out(f"== {be.name}: {be.device_name}, matmul precision {entry['matmul_precision']}")
    for r in entry["matmul"]:
        err = "" if r["max_abs_err"] is None else f"  max err {r['max_abs_err']:.1e}"
        out(f"  matmul {r['size']:>5}^2  {r['ms']:9.3f} ms  {r['gflops']:9.1f} GFLOP/s  [{r['kernel']}]{err}")
    t = entry["train_step"]
    extra = ""
    if t["host_syncs_per_step"] is not None:
        extra = (f", {t['host_syncs_per_step']:.0f} host sync(s), {t['dispatches_per_step']:.0f} dispatches, "
                 f"{t['submissions_per_step']:.0f} submissions per step")
    # a GPU backend records work on the host and the GPU runs it; NumPy computes on the host as it goes
    recording = f" ({t['host_ms_per_step']:.2f} ms of it recording on the host)" if be.is_gpu else ""
    out(f"  train step ({describe_config(t['config'])}), {t['steps']} steps: {t['ms_per_step']:.2f} ms{recording}, "
        f"{t['tokens_per_s']:,.0f} tokens/s{extra}")
    if t["host_us_per_replayed_dispatch"] is not None:
        worker = t["record_thread_us_per_dispatch"]
        wait = t["record_wait_us_per_step"]
        out(f"  host per dispatch: {t['host_us_per_replayed_dispatch']:.1f} us replayed"
            + ("" if worker is None else f" (and {worker:.1f} us on the recording thread, waited for "
               f"{wait:.0f} us a step)")
            + f", {t['host_us_per_eager_dispatch']:.1f} us eager; "
              f"peak memory {t['peak_memory_bytes'] / 2**20:.1f} MiB")
    if t["fallbacks"]:
        out("  NumPy fallbacks (calls so far): " + ", ".join(f"{op} {n}" for op, n in t["fallbacks"].items()))
    for row in entry.get("profile", [])[:15]:
        out(f"    {row['kernel']:<40} {row['calls']:5d} calls {row['ms']:8.3f} ms")
