"""Timing on the GPU: back-to-back dispatches timed in one pass, and bench's host time per dispatch and peak
memory."""
import json

import numpy as np
import pytest

from tinynn import registry


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
