"""Reads and writes between NumPy and the GPU: read-backs after the dispatches that write them, staged writes
in order with the dispatches around them, and writes past the upload buffer."""
import numpy as np
import pytest


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
