"""out_dir on a full or nearly full disk: a one-line error before training, no lock left behind, and a run
refused up front when the disk cannot hold a checkpoint beside the one before it.

The disk is faked (a failing write, a small `shutil.disk_usage`), and also real where this process may mount a
small tmpfs (root with CAP_SYS_ADMIN; otherwise those tests skip)."""
import errno
import json
import os
import shutil
import subprocess

import pytest

from tinynn import memory, rundir
from tinynn.cli import main
from tinynn.config import from_dict

TINY = {"data": "data.txt", "out_dir": "run", "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16,
        "batch_size": 4, "max_steps": 4, "warmup_steps": 1, "eval_interval": 2, "eval_steps": 1,
        "checkpoint_interval": 2, "sample_tokens": 5}
TEXT = "The quick brown fox jumps over the lazy dog. " * 40
VOCAB = len(set(TEXT))


def write_config(path, **overrides):
    path.write_text(json.dumps({**TINY, **overrides}))
    return str(path)


def error_line(capsys, *fragments):
    err = capsys.readouterr().err
    assert err.startswith("tinynn: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert all(f in err for f in fragments), err
    return err


class _FullDiskFile:
    """A file opened on a full disk: its name was created (inodes remain), its bytes cannot be written."""

    def __init__(self, real):
        self.real = real

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.real.close()


def test_a_full_disk_at_start_is_one_line_and_leaves_no_lock(workdir, monkeypatch, capsys):
    real_fdopen = os.fdopen
    cfg = write_config(workdir / "c.json")
    with monkeypatch.context() as full:
        full.setattr(rundir.os, "fdopen", lambda fd, *a, **k: _FullDiskFile(real_fdopen(fd, *a, **k)))
        assert main(["train", "--config", cfg, "--quiet"]) == 2
    error_line(capsys, "out_dir 'run'", "tinynn.lock", "No space left on device")
    assert not (workdir / "run" / rundir.LOCK_NAME).exists()
    assert main(["train", "--config", cfg, "--quiet"]) == 0


def test_an_empty_lock_left_by_a_full_disk_is_taken_over_once_old(workdir, capsys):
    """An empty lock is what a run killed (or refused by a full disk) between creating and writing it leaves;
    a fresh one may be a run starting this very moment."""
    cfg = write_config(workdir / "c.json")
    lock = workdir / "run" / rundir.LOCK_NAME
    lock.parent.mkdir()
    lock.touch()
    assert main(["train", "--config", cfg, "--quiet"]) == 2
    error_line(capsys, "in use by another run (an unreadable lock)")
    old = lock.stat().st_mtime - rundir.EMPTY_LOCK_AGE_S - 1
    os.utime(lock, (old, old))
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    assert f"tinynn: notice: taking over {os.path.join('run', rundir.LOCK_NAME)}, an empty lock" in \
        capsys.readouterr().err
    assert not lock.exists()


def _needed(cfg_path) -> int:
    return memory.checkpoint_bytes(from_dict(json.loads(open(cfg_path).read())), VOCAB)


def _free(monkeypatch, free: int):
    usage = shutil.disk_usage(".")
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda path: usage._replace(free=free))


def test_the_disk_check_wants_room_for_two_checkpoints(workdir, monkeypatch, capsys):
    cfg = write_config(workdir / "c.json")
    needed = _needed(cfg)
    _free(monkeypatch, needed * 3 // 2)  # one checkpoint fits, the second save's file does not
    assert main(["train", "--config", cfg, "--quiet"]) == 2
    error_line(capsys, "out_dir 'run' has", "room for two")
    assert not (workdir / "run" / rundir.LOCK_NAME).exists()
    _free(monkeypatch, 2 * needed)
    assert main(["train", "--config", cfg, "--quiet"]) == 0


def test_a_resumed_checkpoint_counts_toward_the_room_for_two(workdir, monkeypatch, capsys):
    cfg = write_config(workdir / "c.json")
    assert main(["train", "--config", cfg, "--quiet", "--max-steps", "2"]) == 0
    held = (workdir / "run" / "ckpt.safetensors").stat().st_size
    needed = _needed(cfg)
    _free(monkeypatch, 2 * needed - held)  # the resumed file is replaced: its bytes come back
    assert main(["train", "--config", cfg, "--quiet", "--resume"]) == 0
    held = (workdir / "run" / "ckpt.safetensors").stat().st_size
    _free(monkeypatch, 2 * needed - held - 1)
    assert main(["train", "--config", cfg, "--quiet", "--overwrite"]) == 2
    error_line(capsys, "room for two", "ckpt.safetensors included")


@pytest.fixture
def small_disk(workdir):
    """A tmpfs mounted at workdir/disk, sized by the test (`small_disk(bytes)`), or a skip."""
    mounted = []

    def mount(size: int):
        path = workdir / "disk"
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
        mounted.append(path)
        return path
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=True)


def test_a_real_full_disk_at_start(workdir, small_disk, capsys):
    disk = small_disk(64 * 1024)
    (disk / "run").mkdir()
    filler = disk / "filler"
    with pytest.raises(OSError) as full:
        with open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    assert full.value.errno == errno.ENOSPC
    cfg = write_config(workdir / "c.json", out_dir=str(disk / "run"))
    assert main(["train", "--config", cfg, "--quiet"]) == 2
    error_line(capsys, "No space left on device")
    assert not (disk / "run" / rundir.LOCK_NAME).exists()
    filler.unlink()
    assert main(["train", "--config", cfg, "--quiet"]) == 2  # space for the lock, not for two checkpoints
    error_line(capsys, "room for two")


def test_a_real_disk_with_room_for_one_checkpoint_is_refused_up_front(workdir, small_disk, capsys):
    # wide enough that the estimate's metadata allowance (1 MiB) is small beside the weights
    cfg = write_config(workdir / "c.json", n_embd=128, n_head=4, n_layer=2, max_steps=4)
    needed = _needed(cfg)
    disk = small_disk(needed * 3 // 2)
    cfg = write_config(workdir / "c.json", n_embd=128, n_head=4, n_layer=2, max_steps=4, out_dir=str(disk / "run"))
    assert main(["train", "--config", cfg, "--quiet"]) == 2
    error_line(capsys, "room for two")
    assert os.listdir(disk / "run") == []
