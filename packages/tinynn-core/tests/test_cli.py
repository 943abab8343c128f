"""The `tinynn` command end to end: train, resume, checkpoints, generate, demo, info, and its errors.

The training tests run once per device (`device`): the CPU, and the GPU when tinynn-gpu is installed
(lavapipe in CI; TINYNN_REQUIRE_GPU=1 makes a missing GPU a failure)."""
import json
import math
import os

import numpy as np
import pytest

from tinynn import checkpoint, registry
from tinynn.cli import main

TINY = {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "batch_size": 4, "max_steps": 6,
        "warmup_steps": 2, "eval_interval": 3, "eval_steps": 2, "checkpoint_interval": 3, "sample_tokens": 20,
        "sample_prompt": "The "}


def _devices():
    return ["cpu", "gpu"] if registry.discovered() or os.environ.get("TINYNN_REQUIRE_GPU") == "1" else ["cpu"]


@pytest.fixture(params=_devices())
def device(request):
    if request.param == "gpu":
        try:
            registry.select("gpu")
        except Exception as e:
            if os.environ.get("TINYNN_REQUIRE_GPU") == "1":
                pytest.fail(f"TINYNN_REQUIRE_GPU=1 but no GPU backend is usable: {e}")
            pytest.skip(f"no usable GPU backend: {e}")
    return request.param


def write_config(path, **overrides):
    cfg = {**TINY, "data": "data.txt", "out_dir": "run", **overrides}
    path.write_text(json.dumps(cfg))
    return str(path)


def test_train_learns_checkpoints_and_samples(workdir, device, capsys):
    assert main(["train", "--config", write_config(workdir / "c.json", max_steps=40, learning_rate=0.01),
                 "--quiet", "--device", device]) == 0
    out = capsys.readouterr().out
    assert "sample:" in out and "The " in out
    saved = checkpoint.load(workdir / "run" / "ckpt.safetensors")
    assert saved["step"] == 40 and saved["chars"][0] == " "
    losses = saved["history"]["train_loss"]
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])


def test_resume_continues_exactly(workdir, device):
    straight = write_config(workdir / "a.json", out_dir="a")
    assert main(["train", "--config", straight, "--quiet", "--device", device]) == 0
    halves = write_config(workdir / "b.json", out_dir="b")
    assert main(["train", "--config", halves, "--quiet", "--max-steps", "3", "--device", device]) == 0
    assert main(["train", "--config", halves, "--quiet", "--resume", "--device", device]) == 0
    a = checkpoint.load(workdir / "a" / "ckpt.safetensors")
    b = checkpoint.load(workdir / "b" / "ckpt.safetensors")
    assert b["step"] == 6
    np.testing.assert_allclose(b["history"]["train_loss"], a["history"]["train_loss"], rtol=1e-6)
    for name in a["model"]:
        np.testing.assert_allclose(b["model"][name], a["model"][name], rtol=1e-5, atol=1e-7)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(workdir, device, capsys):
    cfg = write_config(workdir / "c.json", max_steps=3, checkpoint_interval=1)
    assert main(["train", "--config", cfg, "--quiet", "--device", device]) == 0
    before = (workdir / "run" / "ckpt.safetensors").read_bytes()
    blowup = write_config(workdir / "d.json", max_steps=50, checkpoint_interval=1, learning_rate=1e30,
                          min_lr=1e29, warmup_steps=0, grad_clip=None)
    capsys.readouterr()
    assert main(["train", "--config", blowup, "--quiet", "--resume", "--device", device]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("tinynn: error: loss became") and "last good checkpoint" in err
    assert (workdir / "run" / "ckpt.safetensors").read_bytes() == before  # every later step was diverging


def test_a_slowly_diverging_run_keeps_the_last_good_checkpoint(workdir, capsys):
    """A huge learning rate gives finite but useless weights: they must not replace the good checkpoint."""
    assert main(["train", "--config", write_config(workdir / "c.json", max_steps=3, checkpoint_interval=1),
                 "--quiet"]) == 0
    before = checkpoint.load(workdir / "run" / "ckpt.safetensors")
    blowup = write_config(workdir / "d.json", max_steps=8, checkpoint_interval=1, learning_rate=1e6, min_lr=1e5,
                          warmup_steps=0)
    capsys.readouterr()
    code = main(["train", "--config", blowup, "--quiet", "--resume"])
    err = capsys.readouterr().err
    after = checkpoint.load(workdir / "run" / "ckpt.safetensors")
    assert after["step"] == 3 and code in (0, 2), err
    assert "tinynn: notice: step 4 not saved" in err or "loss became" in err
    for name, w in after["model"].items():
        np.testing.assert_array_equal(w, before["model"][name])


def test_interrupted_save_leaves_previous_checkpoint_and_the_next_run_cleans_up(workdir, monkeypatch, capsys):
    cfg = write_config(workdir / "c.json", max_steps=3)
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    path = workdir / "run" / "ckpt.safetensors"
    before = path.read_bytes()

    def killed(fd):  # the temporary file is written, the rename never happens
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(checkpoint.os, "fsync", killed)
        assert main(["train", "--config", cfg, "--quiet", "--max-steps", "6", "--resume"]) == 130
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.glob("*.tmp*")] == [f"ckpt.safetensors.tmp-{os.getpid()}"]
    (path.parent / "ckpt.safetensors.tmpa1b2c3").write_bytes(b"an older orphan")
    capsys.readouterr()
    assert main(["train", "--config", cfg, "--quiet", "--max-steps", "6", "--resume"]) == 0
    assert not list(path.parent.glob("*.tmp*"))
    assert "tinynn: notice: removed ckpt.safetensors.tmpa1b2c3" in capsys.readouterr().err


def test_generate(workdir, device, capsys):
    assert main(["train", "--config", write_config(workdir / "c.json"), "--quiet", "--device", device]) == 0
    capsys.readouterr()
    args = ["generate", "--checkpoint", "run/ckpt.safetensors", "--prompt", "The", "--max-new-tokens", "15",
            "--device", device]
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
    if case == "unknown_char":  # the flag and the checkpoint whose tokenizer lacks them
        assert captured.err.startswith("tinynn: error: --prompt: ") and str(ckpt) in captured.err, captured.err


@pytest.mark.parametrize("argv, message", [
    (["train", "--config", "folder"], "config file folder is a folder, not a file"),
    (["train", "--config", "d.json"], "data file folder is a folder with no train.bin: not a token folder"),
    (["generate", "--checkpoint", "folder"], "checkpoint folder is a folder with no config.json: neither"),
])
def test_a_folder_where_a_file_belongs_is_called_one(argv, message, workdir, capsys):
    """An error saying "not found" sent the user looking for a path that is there."""
    (workdir / "folder").mkdir()
    write_config(workdir / "d.json", data="folder")
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"tinynn: error: {message}")


def test_info_json(workdir, capsys):
    assert main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["active"]["backend"] == "cpu"
    assert report["backends"][0]["name"] == "cpu"


def test_all_demos_run_by_default_each_once_and_get_their_results(workdir, monkeypatch, capsys):
    """`tinynn demo` runs the four demos in order, each once, and each does what it shows: autograd's gradient is
    the finite differences', the MLP separates the spirals, the GPT's loss falls from chance and it samples text,
    and the GPU check says why it is skipped on the CPU. What it prints is what it computed."""
    from tinynn import demo
    results = []

    def recorded(number, fn):
        return lambda out: results.append((number, fn(out=out)))
    for number, fn in list(demo.DEMOS.items()):
        monkeypatch.setitem(demo.DEMOS, number, recorded(number, fn))
    assert main(["demo", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert [number for number, _ in results] == [1, 2, 3, 4]
    (_, (analytic, numeric)), (_, accuracy), (_, run), (_, gpu) = results

    assert np.allclose(analytic, numeric, rtol=1e-5, atol=0), (analytic, numeric)
    assert f"dy/dw = {np.round(analytic, 6).tolist()}" in out and "finite differences = " in out

    losses = [float(line.split("loss ")[1]) for line in out.splitlines() if line.startswith("  step ")]
    assert len(losses) == 5 and losses[-1] < losses[0] / 100  # steps 0, 100, 200, 300, 399
    assert accuracy > 0.95 and f"accuracy on 400 points: {accuracy:.1%}" in out

    h, vocab = run.history, run.tokenizer.vocab_size
    assert abs(h["train_loss"][0] - math.log(vocab)) < 0.1  # untrained: about uniform over the characters
    assert h["train_loss"][-1] < h["train_loss"][0] - 1.0 and len(h["train_loss"]) == 60
    assert f"loss {h['train_loss'][0]:.3f} -> {h['train_loss'][-1]:.3f} in 60 steps" in out
    assert len(run.sample) == 1 + 120 and run.sample.replace("\n", "\n          ") in out

    assert gpu is None and "demo 4: GPU check\n  skipped: running on the CPU (" in out
    assert main(["demo", "7"]) == 2
    assert "no demo numbered 7" in capsys.readouterr().err


def test_loss_plot(workdir):
    pytest.importorskip("matplotlib")
    assert main(["train", "--config", write_config(workdir / "c.json", loss_plot="loss.png"), "--quiet"]) == 0
    assert (workdir / "loss.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("device", [d for d in _devices() if d == "gpu"], indirect=True)
def test_gpu_and_cpu_training_histories_agree(workdir, device):
    """The CLI's run on the GPU follows the CPU's loss curve within 1e-3 relative (as the 50-step test)."""
    for d in ("cpu", "gpu"):
        cfg = write_config(workdir / f"{d}.json", out_dir=d, max_steps=30, learning_rate=3e-3, eval_interval=10)
        assert main(["train", "--config", cfg, "--quiet", "--device", d]) == 0
    cpu, gpu = (checkpoint.load(workdir / d / "ckpt.safetensors")["history"] for d in ("cpu", "gpu"))
    for key in ("train_loss", "val_loss"):
        rel = np.abs(np.array(gpu[key]) - cpu[key]) / np.abs(cpu[key])
        assert rel.max() <= 1e-3, f"{key}: max relative difference {rel.max():.2e} at {rel.argmax()}"
    assert gpu["train_loss"][-1] < gpu["train_loss"][0] - 0.3


# --- the findings of issue 11: each is checked before step 1, or survived, with one line and exit 2 ---

def one_line_error(capsys, *fragments):
    """The error is one line (beside any one-line notices, e.g. for a software adapter)."""
    err = "\n".join(line for line in capsys.readouterr().err.splitlines() if not line.startswith("tinynn: notice: "))
    assert err.startswith("tinynn: error: ") and "\n" not in err and "Traceback" not in err, err
    assert all(f in err for f in fragments), err
    return err


@pytest.mark.parametrize("case", ["under_a_file", "is_a_file", "checkpoint_is_a_directory", "read_only"])
def test_a_bad_out_dir_fails_before_training(case, workdir, monkeypatch, capsys):
    (workdir / "afile").write_text("")
    out_dir = {"under_a_file": "afile/sub", "is_a_file": "afile", "checkpoint_is_a_directory": "run",
               "read_only": "ro"}[case]
    (workdir / "run" / "ckpt.safetensors").mkdir(parents=True)
    if case == "read_only":  # tests run as root, whom permissions do not stop: the file system refuses
        def read_only(path, *args):
            raise OSError(30, "Read-only file system")
        monkeypatch.setattr("tinynn.rundir.os.open", read_only)
    cfg = write_config(workdir / "c.json", out_dir=out_dir, checkpoint_interval=0)
    assert main(["train", "--config", cfg]) == 2
    one_line_error(capsys, out_dir)


def test_a_full_disk_keeps_training_and_rescues_the_weights(workdir, monkeypatch, capsys):
    real_open = open

    def full_disk(path, *args, **kwargs):
        if "run" in str(path):
            raise OSError(28, "No space left on device")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(checkpoint, "open", full_disk, raising=False)
    cfg = write_config(workdir / "c.json", max_steps=6, checkpoint_interval=2)
    assert main(["train", "--config", cfg, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert sum("(No space left on device); training goes on" in line for line in err) == 3  # steps 2, 4, 6
    assert "No space left on device" in err[-1] and "was saved to" in err[-1]
    rescued = err[-1].split("was saved to ")[1].split(" instead")[0]
    assert checkpoint.load(rescued)["step"] == 6 and rescued.startswith(str(workdir))  # not left in /tmp
    assert not (workdir / "run" / "ckpt.safetensors").exists()


def test_a_save_that_fails_once_is_retried(workdir, monkeypatch, capsys):
    real_save, calls = checkpoint.save, []

    def flaky(path, **state):
        calls.append(state["step"])
        if len(calls) == 1:
            raise checkpoint.SaveError("cannot write checkpoint (disk full)")
        real_save(path, **state)
    monkeypatch.setattr(checkpoint, "save", flaky)
    assert main(["train", "--config", write_config(workdir / "c.json", max_steps=6, checkpoint_interval=2),
                 "--quiet"]) == 0
    assert calls == [2, 4, 6] and checkpoint.load(workdir / "run" / "ckpt.safetensors")["step"] == 6
    assert "tinynn: notice: cannot write checkpoint (disk full); training goes on" in capsys.readouterr().err


def test_a_fresh_run_refuses_to_overwrite_a_checkpoint(workdir, capsys):
    cfg = write_config(workdir / "c.json", max_steps=3)
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    path = workdir / "run" / "ckpt.safetensors"
    before = path.read_bytes()
    capsys.readouterr()
    assert main(["train", "--config", cfg, "--quiet", "--max-steps", "2"]) == 2
    one_line_error(capsys, "already holds a checkpoint", "--resume", "--overwrite")
    assert path.read_bytes() == before
    assert main(["train", "--config", cfg, "--quiet", "--max-steps", "2", "--overwrite"]) == 0
    assert checkpoint.load(path)["step"] == 2


def test_a_lock_keeps_a_second_run_out_and_a_stale_one_is_taken_over(workdir, capsys):
    import socket
    import subprocess
    import sys
    cfg = write_config(workdir / "c.json", max_steps=2)
    lock = workdir / "run" / "tinynn.lock"
    lock.parent.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(json.dumps({"pid": other.pid, "host": socket.gethostname(), "started": "earlier"}))
        assert main(["train", "--config", cfg, "--quiet"]) == 2
        one_line_error(capsys, "in use by another run", f"process {other.pid} on {socket.gethostname()}")
    finally:
        other.kill()
        other.wait()
    assert main(["train", "--config", cfg, "--quiet"]) == 0  # its process is gone: the lock is stale
    assert f"tinynn: notice: taking over the lock of process {other.pid}" in capsys.readouterr().err
    assert not lock.exists()


@pytest.mark.parametrize("override,message", [
    ({"n_embd": 10**6, "n_head": 1}, "parameters, gradients and AdamW state"),
    ({"batch_size": 10**8}, "activations"),
    ({"data": "unicode.txt", "batch_size": 16, "block_size": 64}, "logits"),
])
def test_sizes_are_checked_against_memory_before_training(override, message, workdir, monkeypatch, capsys):
    if "data" in override:  # a vocabulary of 20,000 characters against a machine with 64 MiB free
        (workdir / "unicode.txt").write_text("".join(map(chr, range(0x4E00, 0x4E00 + 20_000))) * 2)
        monkeypatch.setattr("tinynn.memory.available_bytes", lambda: 64 * 2**20)
    assert main(["train", "--config", write_config(workdir / "c.json", **override), "--device", "cpu"]) == 2
    one_line_error(capsys, "this run needs about", "GiB of memory", message)


def test_a_model_too_large_for_the_host_fails_before_training_on_every_device(workdir, device, capsys):
    cfg = write_config(workdir / "c.json", n_embd=10**6, n_head=1)
    assert main(["train", "--config", cfg, "--device", device]) == 2
    one_line_error(capsys, "this run needs about", "parameters, gradients and AdamW state")


def test_checkpoints_get_the_umask_permissions(workdir):
    old = os.umask(0o022)
    try:
        assert main(["train", "--config", write_config(workdir / "c.json", max_steps=2), "--quiet"]) == 0
    finally:
        os.umask(old)
    assert (workdir / "run" / "ckpt.safetensors").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("argv,fragments", [
    (["--max-steps", "-1"], ["--max-steps must be at least 1, got -1"]),
    (["--max-steps", "0"], ["--max-steps must be at least 1, got 0"]),
    (["--out-dir", ""], ["--out-dir must not be empty"]),
])
def test_command_line_overrides_are_validated_like_the_config(argv, fragments, workdir, capsys):
    assert main(["train", "--config", write_config(workdir / "c.json"), "--quiet", *argv]) == 2
    one_line_error(capsys, *fragments)
    assert not (workdir / "run").exists()


def test_bad_seed_and_a_checkpoint_with_nan_weights_are_one_line_errors(workdir, capsys):
    assert main(["train", "--config", write_config(workdir / "c.json", seed=-1)]) == 2
    one_line_error(capsys, "'seed' must not be negative")
    assert main(["train", "--config", write_config(workdir / "c.json", max_steps=2), "--quiet"]) == 0
    saved = checkpoint.load(workdir / "run" / "ckpt.safetensors")
    saved["model"]["lm_head.weight"][0, 0] = np.nan
    checkpoint.save(workdir / "nan.safetensors", model_state=saved["model"], optimizer_state=saved["optimizer"],
                    config=saved["config"], chars=saved["chars"], step=2, rng_state=saved["rng_state"],
                    history=saved["history"])
    capsys.readouterr()
    assert main(["generate", "--checkpoint", "nan.safetensors"]) == 2
    one_line_error(capsys, "non-finite weights in 'lm_head.weight'")


def test_info_reports_the_device_the_flag_asks_for(workdir, monkeypatch, capsys):
    monkeypatch.setenv("TINYNN_DEVICE", "gpu")  # the flag wins over the environment
    assert main(["info", "--json", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["active"]["backend"] == "cpu"


def test_info_device_gpu_reports_the_gpu(workdir, device, capsys):
    assert main(["info", "--json", "--device", device]) == 0
    assert json.loads(capsys.readouterr().out)["active"]["backend"] == device


def test_warnings_are_one_line_notices_and_numpy_is_quiet(workdir, monkeypatch, capsys):
    import warnings

    from tinynn import demo

    def warns(out=print):
        warnings.warn("running on a software adapter (llvmpipe): expect it to be slow", stacklevel=2)
        np.exp(np.float32(1000))  # an overflow warning, before NaN would stop a run
    monkeypatch.setitem(demo.DEMOS, 1, warns)
    assert main(["demo", "1"]) == 0
    err = capsys.readouterr().err
    assert err == "tinynn: notice: running on a software adapter (llvmpipe): expect it to be slow\n"


def test_speedups_below_one_keep_two_digits():
    from tinynn.demo import speedup
    assert speedup(1.0, 30.0) == "0.033x" and speedup(30.0, 1.0) == "30.0x"


def test_every_option_has_help_and_its_default(workdir):
    from tinynn.cli import build_parser
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in commands.items():
        text = " ".join(sub.format_help().split())
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings} has no help"
            takes_value = action.option_strings and action.nargs != 0 and action.dest != "help" and not action.required
            if takes_value:
                formatted = sub._get_formatter()._expand_help(action)
                assert "(default:" in formatted, f"{name} {action.option_strings}: {formatted}"
        assert sub.description and sub.description in text


def test_the_readme_commands_run_as_written(workdir):
    """Read in order, as a newcomer runs them: each `tinynn` command parses and names files that exist, a
    config that draws a loss plot comes after an install of the plot extra, a fresh `train` does not meet a
    checkpoint that an earlier one wrote, and `generate` reads a checkpoint that a `train` before it writes."""
    import re
    import shlex
    from pathlib import Path

    from tinynn import config
    from tinynn.cli import build_parser
    root = Path(__file__).resolve().parents[3]
    if not (root / "README.md").is_file():
        pytest.skip("the README is not beside this test tree")
    blocks = re.findall(r"```bash\n(.*?)```", (root / "README.md").read_text(), re.S)
    lines = [line.split("#")[0] for line in "".join(blocks).replace("\\\n", " ").splitlines()]
    written, plot_installed, commands = set(), False, 0
    for line in lines:
        if "pip install" in line:
            plot_installed |= "[plot]" in line
            continue
        words = shlex.split(line)
        if "tinynn" not in words:
            continue
        argv = [a for a in words[words.index("tinynn") + 1:] if not (a[0] == "[" or a[-1] == "]" or "|" in a)]
        args = build_parser().parse_args(argv)
        commands += 1
        if args.command == "train":
            cfg = config.load(root / args.config)
            ckpt = f"{args.out_dir or cfg.out_dir}/ckpt.safetensors"
            assert plot_installed or not cfg.loss_plot, f"{args.config} draws a plot before matplotlib is installed"
            synopsis = "[" in line  # a usage line lists options rather than running one command
            assert synopsis or ckpt not in written or args.resume or args.overwrite, f"refused: {line.strip()}"
            written.add(ckpt)
        if args.command == "generate":
            assert args.checkpoint in written, f"{args.checkpoint} is not written by a train command before it"
    assert commands >= 8


def test_ones_and_zeros_take_sizes_like_pytorch():
    import tinynn
    assert tinynn.ones(2, 3).shape == (2, 3) and not tinynn.ones(2, 3).requires_grad
    assert tinynn.zeros((4, 1)).shape == (4, 1) and tinynn.zeros(5).shape == (5,)
