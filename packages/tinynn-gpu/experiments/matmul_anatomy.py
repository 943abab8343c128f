"""Where a blocked matmul's time goes: each configuration timed whole and with parts of its kernel cut out (the
results of the cut variants are wrong on purpose; only their time means something).

    python packages/tinynn-gpu/experiments/matmul_anatomy.py

  base      the kernel as shipped
  noglobal  A and B loads read element 0 (cache hits): what global memory costs
  nolds     also no tile stores and no barriers: the inner loop alone, reading stale tiles
  const     also every thread reads the same tile addresses: the inner loop without per-thread index work
  fma       base with fma() in place of `acc + a * b`

Timed with `Runtime.time_pass` (back-to-back dispatches in one pass) after 2 s of load, so the clock is steady.
"""
import re
import time

import numpy as np

import tinynn_gpu.matmul_blocked as blocked
from tinynn import backends
from tinynn_gpu.matmul_blocked import BlockConfig, BlockedMatmul


def noglobal(code):
    return re.sub(r"return (a|b)\[\(.*?\)( / 4u)?\];", r"return \1[0u];", code)


def nolds(code):
    code = re.sub(r"(a|b)_tile\[(a|b)_buf\][^=;]*= [^;]*;", "", noglobal(code))
    return code.replace("workgroupBarrier();", "")


def const(code):
    return re.sub(r"\[(a|b)_column_\d+\]", "[0u]", nolds(code))


def usefma(code):
    return re.sub(r"(acc_\d+_\d+) = \1 \+ (a\d+_\d+\.[xyzw]) \* (b\d+_\d+);", r"\1 = fma(vec4<f32>(\2), \3, \1);", code)


CUTS = {"base": lambda code: code, "noglobal": noglobal, "nolds": nolds, "const": const, "fma": usefma}
CASES = [((4096, 4096, 4096, False, False), BlockConfig(128, 128, 16, 8, 8)),
         ((2048, 3072, 768, False, True), BlockConfig(128, 128, 16, 8, 8)),
         ((2048, 1024, 256, False, True), BlockConfig(64, 64, 16, 4, 4)),
         ((2048, 1024, 256, False, True), BlockConfig(128, 64, 16, 8, 4))]


def main():
    gpu = backends.select("gpu")
    rt = gpu.rt
    g = np.random.default_rng(0)
    shipped = blocked.generate
    runs = []
    for (m, n, k, ta, tb), config in CASES:
        a = gpu.from_numpy(g.standard_normal((k, m) if ta else (m, k), dtype=np.float32))
        b = gpu.from_numpy(g.standard_normal((n, k) if tb else (k, n), dtype=np.float32))
        out = rt.empty((m, n))
        for cut, edit in CUTS.items():
            blocked.generate = lambda *args, edit=edit, **kw: edit(shipped(*args, **kw))
            variant = BlockedMatmul(rt, config)  # compiles its modules with the cut generator on first use
            call = (lambda variant=variant, a=a, b=b, out=out, m=m, n=n, k=k, ta=ta, tb=tb:
                    variant.record(a.buffer, b.buffer, out, 1, m, n, k, ta, tb, True))
            call()
            runs.append((f"{m}x{n}x{k} {config.name}", cut, 2 * m * n * k, call))
    blocked.generate = shipped
    rt.sync()
    heat_until = time.perf_counter() + 2.0
    while time.perf_counter() < heat_until:
        runs[0][3]()
        rt.sync()
    for label, cut, flops, call in runs:
        ms = min(rt.time_pass(call, 10) for _ in range(3))
        print(f"{label:<32} {cut:<9} {ms * 1e3:8.1f} us {flops / ms / 1e9:5.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
