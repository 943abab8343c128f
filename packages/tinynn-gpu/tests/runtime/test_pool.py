"""The runtime's memory: its accounting of arrays in use, pooled and at the peak, the pool's size buckets
under the binding limit, scratch arrays, and out of memory (the pool trimmed, then the size named)."""
import gc

import numpy as np
import pytest

from tinynn import backends
from tinynn.errors import TinynnError
from tinynn_gpu.runtime.webgpu import wgpu


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
    buffer, view = a.buffer, a.view((10, 100))
    del a
    gc.collect()
    assert gpu.memory_stats()["in_use_bytes"] == held["in_use_bytes"]  # the view holds a's buffer
    del view, b
    gc.collect()
    freed = gpu.memory_stats()
    assert freed["in_use_bytes"] == start["in_use_bytes"]
    assert freed["peak_bytes"] == held["in_use_bytes"]
    assert freed["pooled_bytes"] - held["pooled_bytes"] == 2 * 4096  # exactly the two buffers given back
    c = gpu.from_numpy(np.zeros(1000, np.float32))  # one of them taken again
    assert gpu.memory_stats()["pooled_bytes"] == freed["pooled_bytes"] - 4096
    del c
    gpu.empty_cache()
    assert gpu.memory_stats()["pooled_bytes"] == 0 and not any(rt.pool.free.values())
    with pytest.raises(wgpu.GPUValidationError):  # the pool trimmed it: destroyed, not just forgotten
        # through the runtime's recorder: wgpudawn's own queue.write_buffer leaves, when it raises, a memoryview
        # in a reference cycle that crashes the garbage collector
        rt.recording.write(buffer, b"\0" * 4, 0)


def test_the_pool_sizes_an_array_by_the_limit_in_force(gpu, monkeypatch):
    """The pool remembers each (shape, dtype)'s size bucket, never one clamped to a binding limit in force
    only at the time; its shapes are Python ints however they were asked for."""
    from tinynn_gpu.runtime.arrays import TooLarge
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


def test_scratch_grows_by_buckets_and_refuses_what_no_binding_holds(gpu, monkeypatch):
    """A scratch array is reused while big enough, replaced by a whole bucket when not, and one past the
    binding limit is refused like any array (a kernel bound to a smaller one would write past its end)."""
    from tinynn_gpu.runtime.arrays import TooLarge
    rt = gpu.rt
    first = rt.scratch(5, 100)
    assert rt.scratch(5, 60) is first and first.size >= 100
    bigger = rt.scratch(5, first.size + 1)
    assert bigger is not first and bigger.size > first.size
    with monkeypatch.context() as patched:
        patched.setattr(rt, "max_binding", 4000)
        with pytest.raises(TooLarge):
            rt.scratch(6, 2000)  # 8000 bytes
        assert rt.scratch(6, 900).size == 1000  # a 4096-byte bucket, held to the limit


def test_the_numpy_backend_reports_what_it_can():
    cpu = backends.reference()
    assert cpu.memory_stats() == {"in_use_bytes": None, "pooled_bytes": 0, "peak_bytes": None}
    cpu.empty_cache()


def test_out_of_memory_trims_the_pool_then_names_the_size(gpu, monkeypatch):
    rt = gpu.rt
    gc.collect()  # earlier tests' arrays go back to the pool first, so emptying it leaves none of the size below
    gpu.empty_cache()
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
