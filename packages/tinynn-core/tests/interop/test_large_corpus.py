"""A 200 MB corpus is prepared and trained on by processes that never hold it: each runs with its private
memory capped below the corpus's size (RLIMIT_DATA: the heap and anonymous mappings; the memory-mapped token
files are file pages, not counted) and its peak resident set is asserted well below it. RLIMIT_AS would count
the mapping of the token files itself, and BLAS's reserved address space, so it caps the wrong thing.
Slow (a minute on two cores): it lives in the interop session."""
import json
import os
import subprocess
import sys

import numpy as np

CORPUS_BYTES = 200 * 2**20
DATA_CAP = 170 * 2**20  # private memory: Python, NumPy and OpenBLAS's buffers take ~90 MB of it before any data
RSS_LIMIT = 100 * 2**20

RUN = """
import resource, sys
resource.setrlimit(resource.RLIMIT_DATA, ({cap}, {cap}))
from tinynn.cli import main
code = main({argv!r})
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print("peak-rss", int(status["VmHWM"].split()[0]) * 1024)  # this process's own peak (ru_maxrss counts the parent's)
sys.exit(code)
"""


def _write_corpus(path, size):
    """Lines of words drawn from a made-up vocabulary, written a few MB at a time."""
    draw = np.random.default_rng(0)
    words = ["".join(draw.choice(list("abcdefghijklmnopqrstuvwxyz"), size=n)) for n in draw.integers(1, 9, 3000)]
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size:
            picks = draw.integers(0, len(words), 600_000)
            block = " ".join(words[i] for i in picks).replace(" " + words[0] + " ", "\n")
            block = block[: size - written] + "\n"
            f.write(block)
            written += len(block)


def _run(argv, tmp_path):
    proc = subprocess.run([sys.executable, "-c", RUN.format(cap=DATA_CAP, argv=argv)], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak = int(proc.stdout.rsplit("peak-rss", 1)[1])
    assert peak < RSS_LIMIT, f"{argv[0]} peaked at {peak / 2**20:.0f} MiB resident"
    return proc.stdout, peak


def test_200_mb_corpus_prepared_and_trained_within_a_memory_cap(tmp_path):
    corpus = tmp_path / "corpus.txt"
    _write_corpus(corpus, CORPUS_BYTES)
    assert corpus.stat().st_size >= CORPUS_BYTES
    _, prepare_peak = _run(["prepare", str(corpus), "--out", str(tmp_path / "tokens"), "--quiet"], tmp_path)
    meta = json.loads((tmp_path / "tokens" / "meta.json").read_text())
    assert meta["train_tokens"] + meta["val_tokens"] >= CORPUS_BYTES
    config = {"data": str(tmp_path / "tokens"), "block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32,
              "batch_size": 8, "max_steps": 3, "warmup_steps": 1, "eval_interval": 3, "eval_steps": 2,
              "out_dir": str(tmp_path / "run"), "sample_tokens": 20}
    (tmp_path / "config.json").write_text(json.dumps(config))
    out, train_peak = _run(["train", "--config", str(tmp_path / "config.json"), "--quiet", "--device", "cpu"],
                           tmp_path)
    assert (tmp_path / "run" / "ckpt.safetensors").is_file() and "sample:" in out
    print(f"peak resident memory: prepare {prepare_peak / 2**20:.0f} MiB, train {train_peak / 2**20:.0f} MiB")
