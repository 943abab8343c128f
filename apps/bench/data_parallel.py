"""Data-parallel scaling: tokens/s of one process against N MPI ranks, and where a data-parallel step's
time goes (the read-back of the flat gradients, the Allreduce, the writes).

The config's batch_size is per rank here (16 per GPU for mid.json); each rank runs `--accum` micro-batches
of it per optimizer step, so the global batch is batch_size * accum * ranks. Rank 0 prints one JSON object.

    python apps/bench/data_parallel.py --config apps/bench/mid.json --device gpu                 # 1 GPU
    mpiexec -n 2 python apps/bench/data_parallel.py --config apps/bench/mid.json --device gpu    # 2 ranks
    mpiexec -n 2 python apps/bench/data_parallel.py --config apps/bench/mid.json --device gpu --accum 4

"in_step_ms" is measured inside the timed steps: "round_trip" (the gradients read back, summed over the
ranks and written, in the step's pipelined parts) and "read_back" (one process's loss) include waiting for
the GPU to finish the forward and backward, and for the slowest rank. "isolated_ms" times each piece alone on
an idle GPU after the run, 20 times: the whole read-back, the step's persistent Allreduces one after the
other, one plain Allreduce of the whole, the write, and the round trip without and with the pipelining.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter

import numpy as np

from tinynn import config, distributed, registry, rng
from tinynn.bench import vocabulary
from tinynn.model import GPT
from tinynn.optim import AdamW, decay_groups
from tinynn.train import TrainStep


def timed(seconds: Counter, name: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        seconds[name] += time.perf_counter() - t0
        return out
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--device", default="gpu")
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--steps", type=int, default=30, help="timed steps (after 8 warm-up steps)")
    args = parser.parse_args()

    world = distributed.world()
    backend = registry.set_default(args.device)
    cfg = config.load(args.config)
    rng.manual_seed(0)
    model = GPT(cfg.model_config(vocabulary(cfg)))  # as tinynn bench and the PyTorch reference: 65 unless given
    opt = AdamW(decay_groups(list(model.named_parameters()), 0.1), lr=3e-4, max_grad_norm=1.0)
    rows = cfg.batch_size * args.accum  # this rank's rows per optimizer step
    step = TrainStep(model, opt, rows, cfg.block_size, args.accum, world)
    x = np.random.default_rng(world.rank).integers(0, vocabulary(cfg), (rows, cfg.block_size))

    seconds = Counter()
    backend.to_numpy = timed(seconds, "read_back", backend.to_numpy)
    backend.reduce_on_host_ = timed(seconds, "round_trip", backend.reduce_on_host_)

    for _ in range(8):  # warm-up: autotuning, caches, both halves captured
        step(x, x, 3e-4).item()
    backend.sync()
    if world.comm is not None:
        world.comm.Barrier()
    seconds.clear()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(x, x, 3e-4).item()
    backend.sync()  # a data-parallel step's update may still be running
    per_step = (time.perf_counter() - t0) / args.steps
    in_step = {k: v / args.steps * 1e3 for k, v in seconds.items()}  # before the isolated pieces add to them

    isolated = {}
    if step.world is not None:
        flat = step._pack()  # the packed gradients, already on the GPU
        host, dst = step.host, step.flat.data

        def round_trip(in_thread):
            backend.reduce_on_host_(flat.data, dst, host, step.parts, in_thread=in_thread)
            backend.sync()
        pieces = {"read_back": lambda: backend.to_numpy(flat.data, out=host),
                  "allreduce": lambda: [sum_part() for _, _, sum_part in step.parts],  # the step's persistent ones
                  "plain_allreduce": lambda: world.allreduce_(host),
                  "write": lambda: (backend.write_(dst, host), backend.sync()),
                  "round_trip_serial": lambda: round_trip(False),
                  "round_trip": lambda: round_trip(world.threaded)}
        for name, fn in pieces.items():
            world.comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(20):
                fn()
            isolated[name] = (time.perf_counter() - t0) / 20 * 1e3
    adapter = f"{backend.device_name} (TINYNN_ADAPTER_INDEX={os.environ.get(distributed.ADAPTER_VAR)})"
    adapters = world.comm.gather(adapter, root=0) if world.comm is not None else [adapter]
    if world.is_root:
        tokens = rows * world.size * cfg.block_size
        print(json.dumps({
            "ranks": world.size, "adapters": adapters, "accum": args.accum,
            "config": {k: getattr(cfg, k) for k in ("n_layer", "n_head", "n_embd", "block_size", "batch_size")},
            "global_batch": rows * world.size, "ms_per_step": per_step * 1e3, "tokens_per_s": tokens / per_step,
            "flat_mb": 4 * sum(p.size for p in opt.params) / 1e6,
            "in_step_ms": in_step, "isolated_ms": isolated}))


if __name__ == "__main__":
    main()
