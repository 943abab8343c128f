"""`tinynn train` at its edges: which checkpoint a run keeps (a first validation loss, Ctrl-C, a failed save),
resume's edge cases, the loss plot checked before training, and what the run prints."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tinynn import checkpoint
from tinynn.cli import main
from tinynn.train_step import TrainStep

TINY = {"data": "data.txt", "out_dir": "run", "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16,
        "batch_size": 4, "max_steps": 12, "warmup_steps": 2, "eval_interval": 4, "eval_steps": 2,
        "checkpoint_interval": 4, "sample_tokens": 5, "sample_prompt": "The "}


def write_config(path, **overrides):
    path.write_text(json.dumps({**TINY, **overrides}))
    return str(path)


def notices_and_error(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    return [line for line in lines if line.startswith("tinynn: notice: ")], lines[-1] if lines else ""


# --- which state is kept ---

def test_an_overfitting_run_whose_only_evaluation_is_the_last_keeps_its_checkpoint(workdir, capsys):
    """The first validation loss has no earlier one to compare with; an overfit model's is far above its
    training losses without any divergence, and must not cost the run its only checkpoint."""
    import random
    random.seed(0)
    (workdir / "over.txt").write_text("ab" * 600 + "".join(random.choice("abcdefghij") for _ in range(150)))
    cfg = write_config(workdir / "c.json", data="over.txt", max_steps=30, eval_interval=30, checkpoint_interval=0,
                       learning_rate=0.01, sample_prompt="")
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    out = capsys.readouterr().out
    saved = checkpoint.load(workdir / "run" / "ckpt.safetensors")
    assert saved["step"] == 30
    assert saved["history"]["val_loss"][0] > 2 * min(saved["history"]["train_loss"])  # it did overfit
    assert "checkpoint: run/ckpt.safetensors" in out


def test_a_diverged_model_at_the_only_evaluation_is_still_not_saved(workdir, monkeypatch, capsys):
    """The training loss measured on the final weights stands in for the missing validation baseline: weights
    it finds diverging are refused as before, and a run that leaves no model fails."""
    from tinynn import train as train_module
    real = train_module.evaluate

    def diverged_on_training_batches(model, batches, split, *args):
        return 100.0 if split == "train" else real(model, batches, split, *args)
    monkeypatch.setattr(train_module, "evaluate", diverged_on_training_batches)
    cfg = write_config(workdir / "c.json", max_steps=8, eval_interval=8, checkpoint_interval=0)
    assert main(["train", "--config", cfg, "--quiet"]) == 2
    notices, last = notices_and_error(capsys)
    assert not (workdir / "run" / "ckpt.safetensors").exists()
    assert any(n.startswith("tinynn: notice: step 8 not saved: its train loss 100 is not within 2x") for n in notices)
    assert last.startswith("tinynn: error: no checkpoint saved in run: every checkpoint step's loss was more "
                           "than 2x the best"), last


@pytest.fixture(autouse=True)
def python_sigint():
    """Python's own SIGINT handler, as in a terminal: a process started in the background by a non-interactive
    shell (a CI script's `&`) inherits SIGINT ignored, and Python then installs none."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_during_step(monkeypatch, at: int, how: str):
    """Ctrl-C while step `at` runs: a real SIGINT to this process ("signal"), or a KeyboardInterrupt raised
    inside the step itself ("raise", as a second Ctrl-C does)."""
    real, calls = TrainStep.__call__, []

    def step(self, *args):
        calls.append(1)
        loss = real(self, *args)
        if len(calls) == at:
            if how == "signal":
                os.kill(os.getpid(), signal.SIGINT)
            else:
                raise KeyboardInterrupt
        return loss
    monkeypatch.setattr(TrainStep, "__call__", step)


def test_ctrl_c_finishes_the_step_saves_it_and_says_how_to_resume(workdir, monkeypatch, capsys):
    straight = write_config(workdir / "a.json", out_dir="a", checkpoint_interval=5)
    assert main(["train", "--config", straight, "--quiet"]) == 0
    cfg = write_config(workdir / "b.json", out_dir="b", checkpoint_interval=5)
    with monkeypatch.context() as m:
        _interrupt_during_step(m, 7, "signal")
        capsys.readouterr()
        assert main(["train", "--config", cfg, "--quiet"]) == 130
    _, last = notices_and_error(capsys)
    assert last.startswith("tinynn: interrupted") and "step 7" in last and "b/ckpt.safetensors" in last \
        and "--resume" in last, last
    assert checkpoint.load(workdir / "b" / "ckpt.safetensors")["step"] == 7  # not step 5's
    assert main(["train", "--config", cfg, "--quiet", "--resume"]) == 0
    a, b = (checkpoint.load(workdir / d / "ckpt.safetensors") for d in "ab")
    assert b["history"] == a["history"]
    for name in a["model"]:
        np.testing.assert_array_equal(b["model"][name], a["model"][name])


def test_sigterm_finishes_the_step_and_saves_it_as_ctrl_c_does(workdir):
    """`kill` or a job scheduler's stop ended the process at once: the steps since the last checkpoint were lost."""
    cfg = write_config(workdir / "c.json", max_steps=100_000, checkpoint_interval=50, eval_interval=100_000)
    run = subprocess.Popen([sys.executable, "-m", "tinynn.cli", "train", "--config", cfg, "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    saved = workdir / "run" / "ckpt.safetensors"
    deadline = time.monotonic() + 60
    while not saved.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert "stopping after this step (SIGTERM again to stop at once)" in err
    step = int(last.split("at step ")[1].split(":")[0])
    assert last.endswith("continue it with --resume") and checkpoint.load(saved)["step"] == step > 50, last
    assert not (workdir / "run" / "tinynn.lock").exists()


def test_a_run_leaves_the_signal_handlers_as_it_found_them(workdir, monkeypatch):
    """train() called in a process that goes on (a notebook, a test, a script training twice) hands SIGINT and
    SIGTERM back: a handler left behind would defer them to a run that is over, and `kill` would only print."""
    _interrupt_during_step(monkeypatch, 3, "signal")
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert before[1] == signal.SIG_DFL
    assert main(["train", "--config", write_config(workdir / "c.json", max_steps=4), "--quiet"]) == 130
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert main(["train", "--config", write_config(workdir / "d.json", out_dir="d", max_steps=2), "--quiet"]) == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_sigterm_is_taken_only_in_a_run_of_one_process_from_the_default():
    """Under MPI the launcher ends the job its own way, and a handler someone else installed is theirs: in both
    SIGTERM is left alone (Ctrl-C's is deferred still); off the main thread nothing is."""
    from tinynn.train import _Interrupts

    def mine(signum, frame):
        """Another's SIGTERM handler."""
    for terminate, installed, taken in [(True, signal.SIG_DFL, True), (False, signal.SIG_DFL, False),
                                        (True, mine, False)]:
        previous = signal.signal(signal.SIGTERM, installed)
        try:
            with _Interrupts(True, terminate=terminate) as interrupts:
                assert (signal.getsignal(signal.SIGTERM) == interrupts._defer) == taken
                assert signal.getsignal(signal.SIGINT) == interrupts._defer
            assert signal.getsignal(signal.SIGTERM) == installed
        finally:
            signal.signal(signal.SIGTERM, previous)
    handlers = []

    def in_a_thread():
        with _Interrupts(True, terminate=True):
            handlers.append((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))
    import threading
    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert handlers == [(signal.getsignal(signal.SIGINT), signal.SIG_DFL)]


@pytest.mark.parametrize("damage, message", [
    ({"optimizer_state": {}}, "it holds no optimizer state"),
    ({"rng_state": {}}, "it holds no random generator state"),
    ({"history": {"step": [1]}}, "its loss history is not one a run writes"),
    ({"step": -3}, "its step is -3"),
])
def test_resuming_a_checkpoint_without_training_state_is_one_line(damage, message, workdir, capsys):
    """A checkpoint written for sampling alone (weights, config, tokenizer; as the generate tests write one) raised
    KeyError or ValueError on --resume, and a negative step trained from it."""
    cfg = write_config(workdir / "c.json", max_steps=4)
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    path = workdir / "run" / "ckpt.safetensors"
    saved = checkpoint.load(path)
    checkpoint.save(path, **{"model_state": saved["model"], "optimizer_state": saved["optimizer"],
                             "config": saved["config"], "step": saved["step"], "rng_state": saved["rng_state"],
                             "history": saved["history"], "tokenizer": saved["tokenizer"], **damage})
    capsys.readouterr()
    assert main(["train", "--config", cfg, "--quiet", "--resume", "--max-steps", "8"]) == 2
    assert capsys.readouterr().err == f"tinynn: error: cannot resume from {os.path.join('run', 'ckpt.safetensors')}: " \
        f"{message} (a checkpoint written for sampling alone, or damaged); train afresh with --overwrite\n"


def test_an_interrupt_inside_a_step_keeps_the_checkpoint_before_it(workdir, monkeypatch, capsys):
    """A second Ctrl-C stops at once, maybe inside the optimizer's update: those weights are never saved."""
    cfg = write_config(workdir / "c.json", checkpoint_interval=5)
    _interrupt_during_step(monkeypatch, 7, "raise")
    assert main(["train", "--config", cfg, "--quiet"]) == 130
    _, last = notices_and_error(capsys)
    assert last.startswith("tinynn: interrupted") and "step 5" in last and "--resume" in last, last
    assert checkpoint.load(workdir / "run" / "ckpt.safetensors")["step"] == 5


def test_a_second_ctrl_c_while_saving_says_which_checkpoint_stands(workdir, monkeypatch, capsys):
    """It said only "tinynn: interrupted"."""
    cfg = write_config(workdir / "c.json", checkpoint_interval=5)
    _interrupt_during_step(monkeypatch, 7, "signal")
    real_save = checkpoint.save

    def save(path, **state):
        if state["step"] == 7:  # the save the first Ctrl-C asked for
            raise KeyboardInterrupt
        real_save(path, **state)
    monkeypatch.setattr(checkpoint, "save", save)
    assert main(["train", "--config", cfg, "--quiet"]) == 130
    _, last = notices_and_error(capsys)
    assert last == f"tinynn: interrupted while saving: step 5's checkpoint is in " \
        f"{os.path.join('run', 'ckpt.safetensors')}; continue it with --resume", last
    assert checkpoint.load(workdir / "run" / "ckpt.safetensors")["step"] == 5


def test_ctrl_c_with_nothing_saved_says_so(workdir, monkeypatch, capsys):
    cfg = write_config(workdir / "c.json", checkpoint_interval=0)
    _interrupt_during_step(monkeypatch, 3, "raise")
    assert main(["train", "--config", cfg, "--quiet"]) == 130
    _, last = notices_and_error(capsys)
    assert last.startswith("tinynn: interrupted") and "no checkpoint" in last, last


def test_ctrl_c_rescues_a_good_state_whose_save_failed(workdir, monkeypatch, capsys):
    real_open = open

    def full_disk(path, *args, **kwargs):
        if "run" in str(path):
            raise OSError(28, "No space left on device")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(checkpoint, "open", full_disk, raising=False)
    cfg = write_config(workdir / "c.json", checkpoint_interval=2)
    _interrupt_during_step(monkeypatch, 5, "raise")  # inside step 5: step 4's state waits in memory
    assert main(["train", "--config", cfg, "--quiet"]) == 130
    _, last = notices_and_error(capsys)
    assert last.startswith("tinynn: interrupted") and "was saved to" in last, last
    rescued = last.split("was saved to ")[1].split(" instead")[0]
    assert checkpoint.load(rescued)["step"] == 4 and rescued.startswith(str(workdir))  # not left in /tmp


# --- resume ---

def test_a_resume_with_nothing_left_to_train_is_refused(workdir, capsys):
    cfg = write_config(workdir / "c.json", max_steps=4)
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    capsys.readouterr()
    for steps in ("4", "3"):
        assert main(["train", "--config", cfg, "--quiet", "--resume", "--max-steps", steps]) == 2
        _, last = notices_and_error(capsys)
        assert "step 4" in last and f"max_steps is {steps}" in last and "--max-steps" in last, last


def test_resume_and_overwrite_together_are_refused(workdir, capsys):
    cfg = write_config(workdir / "c.json", max_steps=4)
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    before = (workdir / "run" / "ckpt.safetensors").read_bytes()
    capsys.readouterr()
    assert main(["train", "--config", cfg, "--quiet", "--resume", "--overwrite", "--max-steps", "6"]) == 2
    _, last = notices_and_error(capsys)
    assert last.startswith("tinynn: error: ") and "--resume" in last and "--overwrite" in last, last
    assert (workdir / "run" / "ckpt.safetensors").read_bytes() == before


def test_a_resume_that_changes_how_the_run_trains_names_each_change(workdir, capsys):
    cfg = write_config(workdir / "c.json", max_steps=4)
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    capsys.readouterr()
    changed = write_config(workdir / "c.json", max_steps=8, learning_rate=0.003, batch_size=8, eval_interval=2)
    assert main(["train", "--config", changed, "--quiet", "--resume"]) == 0
    notices, _ = notices_and_error(capsys)
    said = [n for n in notices if "resum" in n]
    assert len(said) == 1, notices
    assert "learning_rate 0.001 -> 0.003" in said[0] and "batch_size 4 -> 8" in said[0], said
    assert "eval_interval" not in said[0] and "max_steps" not in said[0], said  # they change no step's update


def test_an_unchanged_resume_says_nothing(workdir, capsys):
    cfg = write_config(workdir / "c.json", max_steps=4)
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    assert main(["train", "--config", cfg, "--quiet", "--resume", "--max-steps", "6"]) == 0
    notices, _ = notices_and_error(capsys)
    assert notices == []


def test_new_characters_on_resume_name_the_data_and_the_checkpoint(workdir, capsys):
    cfg = write_config(workdir / "c.json", max_steps=4)
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    (workdir / "data.txt").write_text("The quick brown fox jumps over the lazy dog! " * 40)
    capsys.readouterr()
    assert main(["train", "--config", cfg, "--quiet", "--resume", "--max-steps", "6"]) == 2
    _, last = notices_and_error(capsys)
    assert "data.txt" in last and "run/ckpt.safetensors" in last and "'!'" in last, last


# --- what the run prints ---

def test_without_a_validation_split_the_evaluation_is_not_called_a_second_train_loss(workdir, capsys):
    assert main(["train", "--config", write_config(workdir / "c.json", val_fraction=0.0), "--quiet"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert lines and all(line.count("train loss") == 1 for line in lines), lines


# --- the loss plot, checked before training ---

@pytest.mark.parametrize("plot,fragment", [
    ("loss.xyz", "must end in a format matplotlib writes"),
    ("loss", "must end in a format matplotlib writes"),
    ("plots", "is a folder"),
    ("afile/loss.png", "cannot be written"),
    ("/proc/loss.png", "cannot be written"),  # a place no one may write, root included
])
def test_a_loss_plot_that_cannot_be_written_fails_before_training(plot, fragment, workdir, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    (workdir / "plots").mkdir()
    (workdir / "afile").write_text("")
    steps = []
    monkeypatch.setattr(TrainStep, "__call__", lambda self, *a: steps.append(1))
    assert main(["train", "--config", write_config(workdir / "c.json", loss_plot=plot), "--quiet"]) == 2
    _, last = notices_and_error(capsys)
    assert last.startswith("tinynn: error: loss_plot ") and repr(plot) in last and fragment in last, last
    assert steps == [] and not (workdir / "run").exists()


def test_a_plot_that_fails_after_training_costs_neither_the_checkpoint_nor_the_sample(workdir, monkeypatch,
                                                                                        capsys):
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", disk_full)
    assert main(["train", "--config", write_config(workdir / "c.json", loss_plot="run/loss.png"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "sample:" in captured.out and "loss curve" not in captured.out
    assert "tinynn: notice: loss_plot 'run/loss.png' not written (No space left on device)" in captured.err
    assert checkpoint.load(workdir / "run" / "ckpt.safetensors")["step"] == 12


def test_two_out_dirs_of_one_config_get_two_plots(workdir, capsys):
    pytest.importorskip("matplotlib")
    cfg = write_config(workdir / "c.json", loss_plot="run/loss.png", max_steps=4)
    for out in ("a", "b"):
        assert main(["train", "--config", cfg, "--quiet", "--out-dir", out]) == 0
        assert f"loss curve: {out}/loss.png" in capsys.readouterr().out
    assert (workdir / "a" / "loss.png").is_file() and (workdir / "b" / "loss.png").is_file()
    assert not (workdir / "run").exists()


# --- output to a closed pipe ---

def _with_stdout_closed(argv, cwd):
    """`tinynn ... | head -1` once head has exited: the reader of stdout is gone before the first line."""
    import subprocess
    import sys
    job = subprocess.Popen([sys.executable, "-m", "tinynn.cli", *argv], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, cwd=cwd, env={**os.environ, "TINYNN_DEVICE": "cpu"})
    job.stdout.close()
    err = job.stderr.read().decode()
    return job.wait(timeout=120), err


def test_a_closed_stdout_does_not_end_training(workdir):
    code, err = _with_stdout_closed(["train", "--config", write_config(workdir / "c.json"), "--quiet"], workdir)
    assert code == 0 and "Traceback" not in err and "Error" not in err, err
    assert checkpoint.load(workdir / "run" / "ckpt.safetensors")["step"] == 12


def test_generate_into_a_closed_pipe_stops_quietly(workdir):
    assert main(["train", "--config", write_config(workdir / "c.json"), "--quiet"]) == 0
    code, err = _with_stdout_closed(["generate", "--checkpoint", "run/ckpt.safetensors", "--max-new-tokens", "50"],
                                    workdir)
    assert code == 141 and err == "", err


# --- the order of the checks ---

def test_a_bad_data_file_is_reported_before_the_device_starts(workdir, monkeypatch, capsys):
    from tinynn import registry
    started = []
    monkeypatch.setattr(registry, "set_default", lambda device: started.append(device))
    for data in ("missing.txt", "empty.txt"):
        (workdir / "empty.txt").write_text("")
        assert main(["train", "--config", write_config(workdir / "c.json", data=data), "--device", "gpu"]) == 2
        _, last = notices_and_error(capsys)
        assert data in last, last
    assert started == []


# --- under mpiexec ---

def test_ctrl_c_under_mpiexec_saves_the_step_it_ended(workdir):
    """Rank 0 finishes its step and saves it before it ends the job (the other ranks wait in the next step's
    sum until then)."""
    import shutil
    import sys
    from pathlib import Path

    from test_distributed import interrupted
    mpiexec = shutil.which("mpiexec", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if mpiexec is None:
        if os.environ.get("TINYNN_REQUIRE_MPI") == "1":
            pytest.fail("TINYNN_REQUIRE_MPI=1 but there is no mpiexec (pip install 'tinynn-core[mpi]')")
        pytest.skip("no mpiexec: pip install 'tinynn-core[mpi]'")
    code, err = interrupted(mpiexec, workdir, "mpiexec")
    assert code == 130, err
    last = [line for line in err.splitlines() if line.startswith("tinynn: interrupted")]
    assert len(last) == 1 and "checkpoint is in dp/ckpt.safetensors; continue it with --resume" in last[0], err
    step = int(last[0].split("at step ")[1].split(":")[0])
    saved = checkpoint.load(workdir / "dp" / "ckpt.safetensors")
    assert saved["step"] == step and saved["history"]["step"][-1] == step


def test_a_bad_data_file_on_a_real_gpu_backend_starts_no_adapter(workdir, capsys):
    """The same on the GPU backend itself: train does not select it (on a software adapter, selecting it gives a
    notice)."""
    from tinynn import registry
    if not registry.discovered():
        pytest.skip("tinynn-gpu is not installed")
    gpu = next((s for s in registry.statuses() if s.name == "gpu"), None)
    if gpu is None or gpu.backend is None:
        pytest.skip("no usable GPU adapter")
    assert main(["train", "--config", write_config(workdir / "c.json", data="missing.txt"), "--device", "gpu"]) == 2
    notices, last = notices_and_error(capsys)
    assert notices == [] and last == "tinynn: error: data file not found: missing.txt", (notices, last)


def test_ctrl_c_while_sampling_names_the_checkpoint(workdir, monkeypatch, capsys):
    from tinynn.model import GPT

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(GPT, "stream", interrupted)
    assert main(["train", "--config", write_config(workdir / "c.json"), "--quiet"]) == 130
    _, last = notices_and_error(capsys)
    assert last == "tinynn: interrupted while sampling, after training: the checkpoint is in run/ckpt.safetensors"


# --- the library call and what a long run shows ---

def test_train_takes_a_dict_of_the_configs_keys_checked_as_json_is(workdir):
    from tinynn.errors import TinynnError
    from tinynn.train import train
    result = train({**TINY, "max_steps": 2, "eval_interval": 2}, progress=False)
    assert result.history["step"] == [1, 2] and result.sample.startswith("The ")
    with pytest.raises(TinynnError, match="n_layr"):
        train({**TINY, "n_layr": 2}, progress=False)


def test_the_sample_after_training_shows_progress_and_is_the_generated_text(workdir, capsys):
    """The sample is drawn token by token under a bar (on a software adapter it takes minutes); its text is what
    `generate` draws from the same model and seed."""
    from tinynn.config import from_dict
    from tinynn.train import train
    cfg = from_dict({**TINY, "max_steps": 2, "eval_interval": 2, "sample_tokens": 40})
    result = train(cfg, progress=True)
    assert "sample" in capsys.readouterr().err
    prompt = result.tokenizer.encode(cfg.sample_prompt)
    again = result.model.generate(np.asarray(prompt)[None, :], 40, temperature=0.8, seed=cfg.seed % 2**32)
    assert result.sample == result.tokenizer.decode(again[0])
