"""The `tinynn` command end to end: train, resume, checkpoints, generate, demo, info, and its errors."""
import json
import math

import numpy as np
import pytest

from tinynn import checkpoint
from tinynn.cli import main

TINY = {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "batch_size": 4, "max_steps": 6,
        "warmup_steps": 2, "eval_interval": 3, "eval_steps": 2, "checkpoint_interval": 3, "sample_tokens": 20,
        "sample_prompt": "The "}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TINYNN_DEVICE", "cpu")
    (tmp_path / "data.txt").write_text("The quick brown fox jumps over the lazy dog. " * 40)
    return tmp_path


def write_config(path, **overrides):
    cfg = {**TINY, "data": "data.txt", "out_dir": "run", **overrides}
    path.write_text(json.dumps(cfg))
    return str(path)


def test_train_learns_checkpoints_and_samples(workdir, capsys):
    assert main(["train", "--config", write_config(workdir / "c.json", max_steps=40, learning_rate=0.01),
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "sample:" in out and "The " in out
    saved = checkpoint.load(workdir / "run" / "ckpt.safetensors")
    assert saved["step"] == 40 and saved["chars"][0] == " "
    losses = saved["history"]["train_loss"]
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])


def test_resume_continues_exactly(workdir):
    straight = write_config(workdir / "a.json", out_dir="a")
    assert main(["train", "--config", straight, "--quiet"]) == 0
    halves = write_config(workdir / "b.json", out_dir="b")
    assert main(["train", "--config", halves, "--quiet", "--max-steps", "3"]) == 0
    assert main(["train", "--config", halves, "--quiet", "--resume"]) == 0
    a = checkpoint.load(workdir / "a" / "ckpt.safetensors")
    b = checkpoint.load(workdir / "b" / "ckpt.safetensors")
    assert b["step"] == 6
    np.testing.assert_allclose(b["history"]["train_loss"], a["history"]["train_loss"], rtol=1e-6)
    for name in a["model"]:
        np.testing.assert_allclose(b["model"][name], a["model"][name], rtol=1e-5, atol=1e-7)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(workdir, capsys):
    cfg = write_config(workdir / "c.json", max_steps=3, checkpoint_interval=1)
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    before = (workdir / "run" / "ckpt.safetensors").read_bytes()
    blowup = write_config(workdir / "d.json", max_steps=50, checkpoint_interval=1, learning_rate=1e30,
                          min_lr=1e29, warmup_steps=0, grad_clip=None)
    assert main(["train", "--config", blowup, "--quiet", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tinynn: error: loss became") and "last good checkpoint" in err and "\n" not in err
    after = checkpoint.load(workdir / "run" / "ckpt.safetensors")
    assert after["step"] >= 3 and len(after["history"]["train_loss"]) == after["step"]
    assert all(math.isfinite(v) for v in after["history"]["train_loss"])
    assert all(np.isfinite(w).all() for w in after["model"].values())
    assert before  # the first run's checkpoint existed, so the diverged run had one to keep


def test_interrupted_save_leaves_previous_checkpoint(workdir, monkeypatch):
    cfg = write_config(workdir / "c.json", max_steps=3)
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    path = workdir / "run" / "ckpt.safetensors"
    before = path.read_bytes()

    def killed(*args, **kwargs):
        (path.parent / (path.name + ".tmp")).write_bytes(b"half a file")
        raise KeyboardInterrupt
    monkeypatch.setattr(checkpoint, "save_file", killed)
    assert main(["train", "--config", cfg, "--quiet", "--max-steps", "6", "--resume"]) == 130
    assert path.read_bytes() == before


def test_generate(workdir, capsys):
    assert main(["train", "--config", write_config(workdir / "c.json"), "--quiet"]) == 0
    capsys.readouterr()
    args = ["generate", "--checkpoint", "run/ckpt.safetensors", "--prompt", "The", "--max-new-tokens", "15"]
    assert main(args + ["--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("The") and len(first.strip()) == 18
    assert main(args + ["--seed", "3"]) == 0
    assert capsys.readouterr().out == first


@pytest.mark.parametrize("case", ["missing", "corrupt", "foreign", "unknown_char", "empty_data", "bad_config",
                                  "resume_other_model"])
def test_bad_input_is_one_line_exit_2(case, workdir, capsys):
    ckpt = workdir / "run" / "ckpt.safetensors"
    if case in ("unknown_char", "resume_other_model"):
        assert main(["train", "--config", write_config(workdir / "c.json"), "--quiet"]) == 0
    capsys.readouterr()
    if case == "missing":
        argv = ["generate", "--checkpoint", "nope.safetensors"]
    elif case == "corrupt":
        (workdir / "x.safetensors").write_bytes(b"\x00" * 50)
        argv = ["generate", "--checkpoint", "x.safetensors"]
    elif case == "foreign":
        from safetensors.numpy import save_file
        save_file({"w": np.zeros(2)}, str(workdir / "f.safetensors"))
        argv = ["generate", "--checkpoint", "f.safetensors"]
    elif case == "unknown_char":
        argv = ["generate", "--checkpoint", str(ckpt), "--prompt", "Zebra~"]
    elif case == "empty_data":
        (workdir / "empty.txt").write_text("")
        argv = ["train", "--config", write_config(workdir / "e.json", data="empty.txt"), "--quiet"]
    elif case == "bad_config":
        argv = ["train", "--config", write_config(workdir / "e.json", n_head=3)]
    else:
        argv = ["train", "--config", write_config(workdir / "e.json", n_embd=32), "--quiet", "--resume"]
    before = ckpt.read_bytes() if ckpt.exists() else None
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("tinynn: error: ") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err
    assert (ckpt.read_bytes() if ckpt.exists() else None) == before


def test_info_json(workdir, capsys):
    assert main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["active"]["backend"] == "cpu"
    assert report["backends"][0]["name"] == "cpu"


def test_demo_4_says_why_it_is_skipped_on_the_cpu(workdir, capsys):
    assert main(["demo", "4", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "demo 4" in out and "skipped" in out


def test_all_demos_run_by_default(workdir, capsys):
    assert main(["demo", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert all(f"demo {n}:" in out for n in (1, 2, 3, 4)) and "sample:" in out
    assert main(["demo", "7"]) == 2
    assert "no demo numbered 7" in capsys.readouterr().err


def test_demos_1_and_2(workdir, capsys):
    assert main(["demo", "1", "2"]) == 0
    out = capsys.readouterr().out
    assert "finite differences" in out
    accuracy = float(out.split("accuracy on 400 points: ")[1].split("%")[0])
    assert accuracy > 95


def test_loss_plot(workdir):
    pytest.importorskip("matplotlib")
    assert main(["train", "--config", write_config(workdir / "c.json", loss_plot="loss.png"), "--quiet"]) == 0
    assert (workdir / "loss.png").read_bytes()[:4] == b"\x89PNG"
