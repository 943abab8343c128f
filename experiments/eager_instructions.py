"""Instructions per eager dispatch: the host's cost of the eager op layer counted by valgrind's callgrind, which
counts instructions, not seconds, so two builds compare without the noise of a shared host (timings of the same
forward move by 2x between processes on the H200's host; the count repeats to 0.05%).

The script runs itself under callgrind with collection off, builds the model, warms it up, then counts only the
forwards it records back to back (no read-back: lavapipe's work on the CPU would be counted too), switched on and
off with `callgrind_control`. Needs valgrind; lavapipe or any adapter.

    python experiments/eager_instructions.py apps/bench/lesson.json --batch 1 --block 32
    PYTHONPATH=/tmp/base/packages/tinynn-core/src:/tmp/base/packages/tinynn-gpu/src python ...  # another build

Session 23 (2-core machine, lesson at 1 x 32, 20 forwards of 37 dispatches, Python 3.11 / 3.12): main before the
session 51.5k / 58.1k instructions a dispatch; after it 46.9k / 53.4k; session 25's PooledArray 45.8k / 52.1k
(BENCHMARKS.md).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def counted(args, flags: Path) -> None:
    """The child, under callgrind: warm up, then record `args.forwards` forwards while the parent counts."""
    import dataclasses

    import numpy as np  # noqa: F401 (imported before counting starts)

    from tinynn import config, registry
    from tinynn.bench import lesson_step
    from tinynn.tensor import Tensor, no_grad

    backend = registry.select("gpu")
    cfg = config.load(args.config)
    cfg = dataclasses.replace(cfg, batch_size=args.batch or cfg.batch_size, block_size=args.block or cfg.block_size)
    step, x = lesson_step(backend, cfg)
    model = step.model.eval()
    inputs = [Tensor(backend.from_numpy(x), backend) for _ in range(2)]
    counters = backend.rt.counters
    with no_grad():
        for _ in range(3):  # pipelines, buffers and bind groups made, and the same arrays alive as when counted
            model(*inputs)[1].item()
        for _ in range(3):
            loss = model(*inputs)[1]
        (flags / "ready").touch()
        while not (flags / "go").exists():
            time.sleep(0.02)
        dispatches, groups = counters["dispatches"], counters["bind_groups_created"]
        for _ in range(args.forwards):
            loss = model(*inputs)[1]
        (flags / "done").touch()
        time.sleep(0.5)  # counted off by then
    print(f"dispatches {counters['dispatches'] - dispatches} bind_groups_made "
          f"{counters['bind_groups_created'] - groups}", file=sys.stderr)
    del loss
    os._exit(0)  # the recording is dropped unsubmitted


def wait_for(path: Path, child) -> None:
    while not path.exists():
        if child.poll() is not None:
            raise SystemExit(f"the counted process ended early ({child.returncode}); its log says why")
        time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--batch", type=int, help="the config's batch_size replaced")
    parser.add_argument("--block", type=int, help="the config's block_size replaced")
    parser.add_argument("--forwards", type=int, default=20)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the flags folder: run as the counted process
    args = parser.parse_args()
    if args.child:
        return counted(args, Path(args.child))
    with tempfile.TemporaryDirectory() as folder:
        flags, log = Path(folder), Path(folder) / "callgrind.log"
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={folder}/out.%p",
                   sys.executable, __file__, *sys.argv[1:], "--child", folder]
        with open(log, "w") as err:
            child = subprocess.Popen(command, stderr=err, env={**os.environ, "PYTHONHASHSEED": "0",
                                                                "TINYNN_AUTOTUNE": "0"})
            try:
                wait_for(flags / "ready", child)
                subprocess.run(["callgrind_control", "-i", "on", str(child.pid)], check=True, capture_output=True)
                (flags / "go").touch()
                wait_for(flags / "done", child)
                subprocess.run(["callgrind_control", "-i", "off", str(child.pid)], check=True, capture_output=True)
            finally:
                child.wait()
        text = log.read_text()
    collected = re.search(r"Collected : (\d+)", text)
    made = re.search(r"dispatches (\d+) bind_groups_made (\d+)", text)
    if not collected or not made:
        raise SystemExit(f"no count in callgrind's log:\n{text[-2000:]}")
    instructions, dispatches, groups = int(collected[1]), int(made[1]), int(made[2])
    print(f"{args.config} at {args.batch or 'its'} x {args.block or 'its'}: {args.forwards} forwards, {dispatches} "
          f"dispatches, {instructions / dispatches / 1e3:.1f}k instructions a dispatch (Python "
          f"{sys.version.split()[0]}; bind groups made while counting: {groups})")


if __name__ == "__main__":
    main()
