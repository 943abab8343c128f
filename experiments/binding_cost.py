"""Host cost of one recorded dispatch against the number of storage buffers its bind group holds: a trivial
kernel binding N buffers, 128 dispatches per encoder cycling over 8 bind groups (as a step's dispatches
cycle over their buffers), recorded and finished through the direct wgpu-native calls (native.py). The
submission itself is left out (a software adapter runs the work inside it). Prints one line per N.

    python experiments/binding_cost.py

wgpu-native validates and tracks every bound buffer when the encoder finishes, so the finish half grows with
N: a kernel that binds buffers it does not use (epilogue slots, unused outputs) pays for them every step.
"""
from __future__ import annotations

import time

import wgpu.backends.wgpu_native._api as api

from tinynn import registry

DISPATCHES, GROUPS, REPS = 128, 8, 60


def main():
    rt = registry.select("gpu").rt
    calls = rt.native
    assert calls is not None, rt.native_reason
    api.libf.wgpuQueueSubmit = lambda *args: None  # finish, but never run the work
    for n in (2, 4, 8, 16, 32):
        decl = "\n".join(f"@group(0) @binding({i}) var<storage, read_write> b{i}: array<f32>;" for i in range(n))
        total = " + ".join(f"b{i}[0]" for i in range(1, n))
        code = f"{decl}\n@compute @workgroup_size(1) fn main() {{ b0[0] = {total}; }}"
        launch = rt.prepare(rt.shader(code, f"bind{n}"), "main", 1, tuple(range(n)))
        arrays, groups = [], []
        for _ in range(GROUPS):
            arrays.append([rt.empty((64,)) for _ in range(n)])
            groups.append(rt.bind_group((launch, *[a.buffer for a in arrays[-1]])))
        runs = [(launch.pipeline._internal, [(groups[k % GROUPS]._internal, 1, 1, 1) for k in range(DISPATCHES)])]
        record, finish = [], []
        for _ in range(REPS):
            t0 = time.perf_counter()
            encoder, compute_pass = calls.begin()
            calls.record(compute_pass, runs)
            t1 = time.perf_counter()
            calls.submit([calls.finish(encoder, compute_pass)])
            record.append(t1 - t0)
            finish.append(time.perf_counter() - t1)
        print(f"{n:2d} buffers: record {1e6 * min(record) / DISPATCHES:.2f} us, end + finish "
              f"{1e6 * min(finish) / DISPATCHES:.2f} us per dispatch (best of {REPS})")


if __name__ == "__main__":
    main()
