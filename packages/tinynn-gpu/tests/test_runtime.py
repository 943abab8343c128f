"""The runtime's memory accounting, its pool's trimming, and the out-of-memory error; bench's GPU figures."""
import gc
import json

import numpy as np
import pytest
import wgpu

from tinynn import backends
from tinynn.errors import TinynnError


def test_memory_stats_count_arrays_in_use_pooled_and_the_peak(gpu):
    rt = gpu.rt
    gc.collect()  # earlier tests' arrays in reference cycles go now, not in the middle
    gpu.memory_stats(reset_peak=True)
    start = gpu.memory_stats()
    a = gpu.from_numpy(np.zeros(1000, np.float32))  # 4000 bytes: a 4096-byte bucket
    b = gpu.from_numpy(np.zeros(1000, np.float32))
    held = gpu.memory_stats()
    assert held["in_use_bytes"] - start["in_use_bytes"] == 2 * 4096
    assert held["peak_bytes"] >= held["in_use_bytes"]
    buffer = a.buffer
    del a, b
    gc.collect()
    freed = gpu.memory_stats()
    assert freed["in_use_bytes"] == start["in_use_bytes"]
    assert freed["peak_bytes"] == held["in_use_bytes"]
    assert freed["pooled_bytes"] >= 2 * 4096
    gpu.empty_cache()
    assert gpu.memory_stats()["pooled_bytes"] == 0 and not any(rt.free.values())
    with pytest.raises(wgpu.GPUValidationError):  # the pool trimmed it: destroyed, not just forgotten
        rt.queue.write_buffer(buffer, 0, b"\0" * 4)


def test_the_pool_sizes_an_array_by_the_limit_in_force(gpu, monkeypatch):
    """The pool remembers each (shape, dtype)'s size bucket, never one clamped to a binding limit in force
    only at the time; its shapes are Python ints however they were asked for."""
    from tinynn_gpu.runtime import TooLarge
    rt = gpu.rt
    with monkeypatch.context() as patched:
        patched.setattr(rt, "max_binding", 4000)
        with pytest.raises(TooLarge):
            rt.empty((40, 50))  # 8000 bytes
        assert rt.empty((np.int64(31), 32)).buffer.size == 4000  # 3968 bytes: a 4096-byte bucket, held to the limit
    assert rt.empty((40, 50)).buffer.size >= 8000
    assert rt.empty((31, 32)).buffer.size == 4096
    shape = rt.empty((np.int64(40), np.int32(50))).shape
    assert shape == (40, 50) and all(type(n) is int for n in shape)


def test_the_numpy_backend_reports_what_it_can():
    cpu = backends.reference()
    assert cpu.memory_stats() == {"in_use_bytes": None, "pooled_bytes": 0, "peak_bytes": None}
    cpu.empty_cache()


def test_out_of_memory_trims_the_pool_then_names_the_size(gpu, monkeypatch):
    rt = gpu.rt
    gpu.empty_cache()  # no pooled buffer of the size asked for below
    spare = gpu.from_numpy(np.zeros(3000, np.float32))
    del spare
    gc.collect()
    assert rt.pooled_bytes > 0

    def out_of_memory(**kwargs):
        raise wgpu.GPUOutOfMemoryError("Not enough memory left")
    monkeypatch.setattr(rt.device, "create_buffer", out_of_memory)
    with pytest.raises(TinynnError, match=r"out of GPU memory allocating 7,340,032 bytes, with [\d,]+ bytes in "
                                          r"use by arrays; try a smaller batch_size"):
        rt.empty((7 * 2**18,))
    assert rt.pooled_bytes == 0


def test_bench_reports_host_time_per_dispatch_and_peak_memory(gpu, tmp_path, capsys):
    from tinynn.cli import main
    config = tmp_path / "c.json"
    config.write_text('{"block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 16, "batch_size": 2}')
    args = ["bench", "--device", "gpu", "--json", "--sizes", "", "--config", str(config), "--steps", "3"]
    assert main(args) in (0, None)
    report = json.loads(capsys.readouterr().out)
    gpu_step = report["backends"]["gpu"]["train_step"]
    assert gpu_step["steps"] == 3 and report["backends"]["cpu"]["train_step"]["steps"] == 3
    assert gpu_step["host_us_per_replayed_dispatch"] > 0 and gpu_step["host_us_per_eager_dispatch"] > 0
    assert gpu_step["peak_memory_bytes"] > 0
    assert main(args + ["--no-cpu"]) in (0, None)
    assert list(json.loads(capsys.readouterr().out)["backends"]) == ["gpu"]
    backends.reset_discovery()


def test_a_read_into_an_array_of_another_shape_or_dtype_is_refused(gpu):
    arr = gpu.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    for out in (np.empty(5, np.float32), np.empty((2, 3), np.int32)):
        with pytest.raises(ValueError, match="cannot read"):
            gpu.rt.read(arr, out=out)
    out = np.empty((2, 3), np.float32)
    assert gpu.rt.read(arr, out=out) is out and out.ravel().tolist() == list(range(6))
