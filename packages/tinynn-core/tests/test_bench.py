"""`tinynn bench`: its flags are checked before any work, long work shows progress, and the report reads as
sentences. Run on the CPU at a tiny scale; the GPU's numbers are BENCHMARKS.md's, never asserted here."""
import json

import pytest

from tinynn import bench, registry
from tinynn.cli import main
from tinynn.config import TrainConfig

TINY = {"block_size": 8, "n_layer": 1, "n_head": 1, "n_embd": 8, "batch_size": 2}


@pytest.fixture
def tiny_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYNN_DEVICE", "cpu")
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


@pytest.mark.parametrize("flags, named", [
    (["--sizes", "abc"], "--sizes"),
    (["--sizes", "0"], "--sizes"),
    (["--sizes", "-5"], "--sizes"),
    (["--sizes", "64,,x"], "--sizes"),
    (["--sizes", "2.5"], "--sizes"),
    (["--steps", "0"], "--steps"),
    (["--steps", "-1"], "--steps"),
])
def test_bad_flags_are_one_line_naming_the_flag_and_exit_2(tiny_config, capsys, flags, named):
    rc = main(["bench", "--device", "cpu", "--config", tiny_config, "--sizes", "8", "--steps", "1"] + flags)
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith(f"tinynn: error: {named}"), err
    assert "Traceback" not in err and out == ""  # refused before any timing


def test_a_matrix_size_larger_than_memory_is_refused_up_front(tiny_config, capsys, monkeypatch):
    monkeypatch.setattr(bench.memory, "available_bytes", lambda: 2**30)
    assert main(["bench", "--device", "cpu", "--config", tiny_config, "--sizes", "8,100000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tinynn: error: --sizes 100000 needs about") and "GiB" in err


def test_parse_sizes():
    assert bench.parse_sizes("256, 512,1024") == [256, 512, 1024]
    assert bench.parse_sizes("") == [] and bench.parse_sizes(" , ") == []  # the training step alone


def test_the_report_reads_as_sentences_without_a_raw_dict(tiny_config, capsys):
    assert main(["bench", "--device", "cpu", "--config", tiny_config, "--sizes", "8", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "{" not in out and "'" not in out, out  # no Python dict or repr
    assert "block 8, 1 layer(s), 1 head(s), n_embd 8, vocab 65, batch 2" in out
    assert "recording" not in out  # NumPy computes as it goes: there is no recording to speak of


def test_the_gpu_report_counts_its_recording_and_fallbacks():
    class FakeGpu:
        name, device_name, is_gpu = "gpu", "a GPU", True
    t = {"steps": 2, "ms_per_step": 10.0, "host_ms_per_step": 1.5, "tokens_per_s": 1000.0,
         "host_syncs_per_step": 1.0, "dispatches_per_step": 40.0, "submissions_per_step": 1.0,
         "host_us_per_replayed_dispatch": 3.0, "record_thread_us_per_dispatch": None,
         "record_wait_us_per_step": None, "host_us_per_eager_dispatch": 9.0, "peak_memory_bytes": 2**20,
         "fallbacks": {"gather": 3, "cumsum": 1},
         "config": {**TINY, "vocab_size": 65, "padded_vocab_size": 65, "tie_embeddings": False, "head_bias": True}}
    lines = []
    bench.print_entry(FakeGpu(), {"matmul": [], "train_step": t, "matmul_precision": "highest"}, out=lines.append)
    text = "\n".join(lines)
    assert "1.50 ms of it recording on the host" in text
    assert "NumPy fallbacks (calls so far): gather 3, cumsum 1" in text and "{" not in text


def test_long_work_shows_progress_on_stderr(tiny_config, capsys):
    """The bar names the work under way (matmul sizes, the training step's warm-up and timed steps) on stderr,
    so that --json's stdout stays one JSON document."""
    assert main(["bench", "--device", "cpu", "--config", tiny_config, "--sizes", "8,16", "--steps", "3",
                 "--json"]) == 0
    out, err = capsys.readouterr()
    json.loads(out)
    for phase in ("matmul 16x16", "training step: warm-up", "training step: 3 timed"):
        assert phase in err, err


def test_a_cpu_matmul_is_not_warmed_for_a_gpus_clock(monkeypatch):
    """The 2 s warm-up raises a GPU's clock; the CPU needs none, and spending it made the CPU bench slow."""
    seen = []
    monkeypatch.setattr(bench, "time_call", lambda fn, sync, **kw: seen.append(kw) or 1e-3)
    bench.bench_matmul(registry.reference(), [8])
    assert seen == [{"warmup_seconds": 0.0}]


def test_bench_train_times_the_steps_asked(tiny_config):
    result = bench.bench_train(registry.reference(), TrainConfig(**TINY), steps=2)
    assert result["steps"] == 2 and result["tokens_per_s"] > 0
