"""Seconds to compile blocked-matmul variants on the WebGPU implementation TINYNN_WEBGPU chooses (optionally with
extra Dawn device toggles): where a software adapter's cold compile time goes.

    MESA_SHADER_CACHE_DIR=$(mktemp -d) TINYNN_WEBGPU=dawn python experiments/compile_times.py \
        [--toggles disable_workgroup_init,...] [--configs 5,18] [--layout nn] [--dump DIR]

Each variant (an index into BLOCK_CONFIGS) runs one matmul of 2 x 2 blocks and 2 tiles of K per split, in the
layout --layout names, twice through the runtime: the first run includes the shader module, the pipeline and the
driver's compile (lavapipe compiles a pipeline at its first dispatch, not at creation), the second is the run
alone. A variant whose WGSL equals an earlier one's (configs that differ in split count only) finds its module
compiled. `--dump DIR` writes each variant's WGSL, as compiled, there. Give a fresh MESA_SHADER_CACHE_DIR for a
cold figure (Mesa caches what it compiled), VK_ICD_FILENAMES to pick a Mesa, LP_NATIVE_VECTOR_WIDTH its width.
"""
from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

import numpy as np

from tinynn_gpu.matmul.blocked import BlockedMatmul, generate
from tinynn_gpu.matmul.configs import BLOCK_CONFIGS
from tinynn_gpu.matmul.problem import Epilogue
from tinynn_gpu.runtime import webgpu


def with_toggles(toggles: list[str]) -> None:
    """Dawn's device opened with these device toggles besides tinynn's."""
    implementation = webgpu.chosen()
    if implementation.name != "dawn":
        raise SystemExit("--toggles are Dawn's")
    from wgpudawn.backends.dawn import extras

    def request_device(adapter, limits, features, checks):
        return extras.request_device_sync(adapter, required_limits=limits, required_features=features,
                                          enable_toggles=("disable_robustness", *toggles),
                                          disable_toggles=("timestamp_quantization",))
    implementation.request_device = request_device


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--toggles", default="", help="Dawn device toggles to enable, comma-separated")
    parser.add_argument("--configs", default="5,18", help="indices into BLOCK_CONFIGS")
    parser.add_argument("--layout", default="nn", help="nn, nt, tn or tt: which operands are stored transposed")
    parser.add_argument("--dump", default="", help="a folder for each variant's WGSL")
    args = parser.parse_args()
    toggles = [t for t in args.toggles.split(",") if t]
    if toggles:
        with_toggles(toggles)
    from tinynn import registry
    start = time.perf_counter()
    gpu = registry.select("gpu")
    rt = gpu.rt
    print(f"{rt.ctx.name}; toggles {args.toggles or '-'}; MESA_SHADER_CACHE_DIR="
          f"{os.environ.get('MESA_SHADER_CACHE_DIR', '(default)')}; backend {time.perf_counter() - start:.1f} s")
    ta, tb = args.layout[0] == "t", args.layout[1] == "t"
    g = np.random.default_rng(0)
    for i in map(int, args.configs.split(",")):
        cfg = BLOCK_CONFIGS[i]
        m, n, k = 2 * cfg.bm, 2 * cfg.bn, 2 * cfg.bk * cfg.splits
        a = gpu.from_numpy(g.standard_normal((k, m) if ta else (m, k)).astype(np.float32))
        b = gpu.from_numpy(g.standard_normal((n, k) if tb else (k, n)).astype(np.float32))
        out = rt.empty((1, m, n))
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            matmul = BlockedMatmul(rt, cfg)
            matmul.record(a, b, out, 1, m, n, k, ta, tb, True, Epilogue())
            gpu.to_numpy(out)
            times.append(time.perf_counter() - t0)
        if args.dump:
            for (layout, quads), shader in matmul.modules.items():
                code = rt.ctx.implementation.wgsl(generate(cfg, *layout, quads), rt.ctx.features)
                Path(args.dump, re.sub(r"\W+", "_", shader.label) + ".wgsl").write_text(code)
        print(f"  [{i:2d}] {cfg.name:44s} first run {times[0]:7.2f} s, second {times[1]:6.3f} s", flush=True)


if __name__ == "__main__":
    main()
