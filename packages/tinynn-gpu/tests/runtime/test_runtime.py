"""The runtime's memory accounting, its pool's trimming, and the out-of-memory error; staged writes; kept
launches; bench's GPU figures."""
import gc
import json

import numpy as np
import pytest

from tinynn import backends, registry
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
    rt = registry.select("gpu").rt  # the backend the command used (an earlier test may have reset discovery)
    assert (gpu_step["record_thread_us_per_dispatch"] is None) == (rt.record_thread is None)
    assert (gpu_step["record_wait_us_per_step"] is None) == (rt.record_thread is None)
    calls, reason, threaded = rt.native, rt.native_reason, rt.record_thread is not None
    rt.use_native(calls, reason, threaded=True)
    try:  # a worker thread's busy time is reported beside the caller's
        assert main(args + ["--no-cpu"]) in (0, None)
    finally:
        rt.use_native(calls, reason, threaded)
    report = json.loads(capsys.readouterr().out)
    assert list(report["backends"]) == ["gpu"]
    threaded_step = report["backends"]["gpu"]["train_step"]
    assert threaded_step["record_thread_us_per_dispatch"] > 0
    assert 0 <= threaded_step["record_wait_us_per_step"] < 1e3 * threaded_step["host_ms_per_step"]
    registry.reset_discovery()


def test_a_read_into_an_array_of_another_shape_or_dtype_is_refused(gpu):
    arr = gpu.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    for out in (np.empty(5, np.float32), np.empty((2, 3), np.int32)):
        with pytest.raises(ValueError, match="cannot read"):
            gpu.rt.read(arr, out=out)
    out = np.empty((2, 3), np.float32)
    assert gpu.rt.read(arr, out=out) is out and out.ravel().tolist() == list(range(6))


@pytest.mark.parametrize("direct", [True, False])
def test_a_read_back_returns_what_the_last_dispatch_wrote(gpu, direct):
    """The read-back waits for the work submitted before it, mapping through wgpu-native's functions (direct)
    or wgpu-py's map_sync (without the direct calls). Reads of several sizes and offsets, each right behind the
    dispatch that writes it."""
    rt = gpu.rt
    calls, reason, threaded = rt.native, rt.native_reason, rt.record_thread is not None
    if not direct:
        rt.use_native(None, "switched off by the test")
    try:
        for n in (1, 3, 1000, 70_000):
            x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
            doubled = gpu.binary("add", gpu.from_numpy(x), gpu.from_numpy(x))
            np.testing.assert_array_equal(gpu.to_numpy(doubled), 2 * x)
            part = np.empty(min(n, 5), np.float32)
            rt.read(doubled, out=part, start=n - part.size)
            np.testing.assert_array_equal(part, 2 * x[n - part.size:])
    finally:
        rt.use_native(calls, reason, threaded)


def test_staged_writes_land_in_order_with_the_dispatches_around_them_in_one_queue_write(gpu):
    rt = gpu.rt
    rt.flush()
    a = rt.empty((4,))
    before = rt.counters["queue_writes"]
    rt.write(a, np.ones(4, np.float32))
    doubled = gpu.binary("add", a, a)  # reads the first values
    rt.write(a, np.full(4, 5.0, np.float32))
    doubled_again = gpu.binary("add", a, a)
    rt.write(a, np.full(2, 9.0, np.float32), start=2)
    assert rt.counters["queue_writes"] == before  # nothing written yet: all of it rides in the next submission
    assert gpu.to_numpy(doubled).tolist() == [2.0] * 4 and gpu.to_numpy(doubled_again).tolist() == [10.0] * 4
    assert gpu.to_numpy(a).tolist() == [5.0, 5.0, 9.0, 9.0]
    assert rt.counters["queue_writes"] == before + 1


def test_a_staged_write_larger_than_the_upload_buffer_grows_it_and_a_huge_one_is_written_at_once(gpu, monkeypatch):
    from tinynn_gpu.runtime import transfer
    rt = gpu.rt
    monkeypatch.setattr(transfer, "STAGED_WRITE_BYTES", 64 * 1024)
    small, big, huge = rt.empty((4,)), rt.empty((8192,)), rt.empty((20000,))
    rt.write(small, np.arange(4, dtype=np.float32))
    size = rt.transfer.upload_buffer.size
    x = np.arange(8192, dtype=np.float32)
    x[: size // 4 + 1] = -1.0
    rt.write(big, x)  # past the buffer (the small write submitted first, then a larger buffer)
    assert rt.transfer.upload_buffer.size >= x.nbytes
    rt.write(huge, np.full(20000, 3.0, np.float32))  # past STAGED_WRITE_BYTES: a queue write of its own
    np.testing.assert_array_equal(gpu.to_numpy(small), np.arange(4))
    np.testing.assert_array_equal(gpu.to_numpy(big), x)
    assert gpu.to_numpy(huge).tolist() == [3.0] * 20000


def test_time_pass_times_back_to_back_dispatches_in_one_pass(gpu):
    rt = gpu.rt
    a = gpu.from_numpy(np.arange(1 << 16, dtype=np.float32))
    sums = []
    rt.flush()
    dispatches, submissions = rt.counters["dispatches"], rt.counters["submissions"]
    ms = rt.time_pass(lambda: sums.append(gpu.binary("add", a, a)), reps=5)
    assert ms > 0 and rt.recording.compute_pass is None
    assert rt.counters["dispatches"] == dispatches + 5 and rt.counters["submissions"] == submissions + 1
    assert np.array_equal(gpu.to_numpy(sums[-1]), 2 * np.arange(1 << 16, dtype=np.float32))
    with pytest.raises(RuntimeError, match="inside a captured step or a profile"):
        rt.profile(lambda: rt.time_pass(lambda: None, 1))


def test_kept_launches_run_on_the_arrays_and_parameters_of_each_call(gpu, rng):
    """The forwards that keep their prepared dispatch (Runtime.keep, the blocked matmul's plans) against the NumPy
    reference at one shape, called again with other arrays (the first ones freed, their buffers reused), other
    parameters (eps, ignore_index, the linear's epilogue) and a split-K variant: a kept launch that bound stale
    arrays or parameters would give the first call's answer."""
    ref = backends.reference()
    n, c, heads, seq = 24, 32, 2, 12

    def close(got, want):
        np.testing.assert_allclose(gpu.to_numpy(got), want, rtol=1e-4, atol=1e-5)

    def data(*shape):
        return rng.standard_normal(shape).astype(np.float32)
    kept = len(gpu.rt.launches)
    for call in range(3):
        x, w, b, res = data(n, c), data(3 * c, c), data(3 * c), data(n, 3 * c)
        eps, ignore = (1e-5, 1e-3, 1e-5)[call], (-100, 3, -100)[call]
        y, _, _ = gpu.layernorm_forward(gpu.from_numpy(x), gpu.from_numpy(w[0]), gpu.from_numpy(b[:c]), eps, False)
        close(y, ref.layernorm_forward(x, w[0], b[:c], eps)[0])
        epilogues = [dict(bias=b), dict(bias=b, activation="gelu"), dict(residual=res)]
        for variant in ("blocked 32x64x16/4x4", "blocked 64x64x16/8x4 split4"):  # split-K: a finish dispatch
            gpu.mm.forced = variant
            try:
                parts = epilogues[call]
                got, _ = gpu.linear_forward(gpu.from_numpy(x), gpu.from_numpy(w), **{
                    k: v if isinstance(v, str) else gpu.from_numpy(v) for k, v in parts.items()}, for_backward=False)
                assert gpu.mm.describe() == variant  # the forced variant ran, not a plan kept from the other
            finally:
                gpu.mm.forced = None
            close(got, ref.linear_forward(x, w, **parts)[0])
        targets = rng.integers(0, 3 * c, n)
        targets[::5] = ignore
        loss, _, _ = gpu.cross_entropy_forward(gpu.from_numpy(res), gpu.from_numpy(targets), ignore, False)
        close(loss, ref.cross_entropy_forward(res, targets, ignore)[0])
        idx = rng.integers(0, n, (2, seq))
        close(gpu.embedding_with_positions_forward(gpu.from_numpy(x), gpu.from_numpy(res[:seq, :c]),
                                                   gpu.from_numpy(idx)),
              ref.embedding_with_positions_forward(x, res[:seq, :c], idx))
        qkv = data(2, seq, 3 * c)
        y, _ = gpu.attention_forward(gpu.from_numpy(qkv), heads, 0.25, False)
        close(y, ref.attention_forward(qkv, heads, 0.25)[0])
        del x, y, loss
        gc.collect()
    # a launch per op and setting (eps, ignore_index: two each), none more for the repeats
    assert len(gpu.rt.launches) - kept <= 2 + 2 + 1 + 1


def test_prepare_gives_one_launch_per_content_and_its_bind_groups_are_per_buffers(gpu):
    """Runtime.prepare hands back the Launch it made for the same pipeline, slots, parameters and workgroups, and
    a new one when any of them changes; a Launch's bind groups are keyed by the buffers, so a launch over other
    buffers (another array, another shape's) makes its own and computes on them, never on the first ones."""
    rt = gpu.rt

    def doubling(n, value=2.0, groups=1):
        return rt.prepare("elementwise", "scalar_main", groups, ("a", "out"), {"n": n, "op": 1, "value": value})
    launch = doubling(4)
    assert doubling(4) is launch
    assert all(other is not launch for other in (doubling(8), doubling(4, value=3.0), doubling(4, groups=2)))
    a, b = rt.upload(np.arange(4, dtype=np.float32)), rt.upload(np.arange(10, 14, dtype=np.float32))
    out_a, out_b = rt.empty((4,)), rt.empty((4,))
    made = rt.counters["bind_groups_created"]
    rt.launch(launch, (a, out_a))
    rt.launch(launch, (b, out_b))
    rt.launch(launch, (a, out_a))
    assert rt.counters["bind_groups_created"] - made == 2
    assert rt.read(out_a).tolist() == [0.0, 2.0, 4.0, 6.0]
    assert rt.read(out_b).tolist() == [20.0, 22.0, 24.0, 26.0]
    wide, out_wide = rt.upload(np.ones((3, 4), np.float32)), rt.empty((3, 4))  # another bucket: another buffer
    rt.launch(doubling(12), (wide, out_wide))
    assert rt.read(out_wide).tolist() == [[2.0] * 4] * 3
