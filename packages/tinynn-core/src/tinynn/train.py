"""The training loop: `train(config)` builds the data, model and optimizer, runs the steps (train_step.py)
with a progress bar, evaluates, checkpoints, and ends with a sample and, where asked, a plot of the losses.
The CLI's `tinynn train` is a thin wrapper around it.

A step reads the loss back once (`loss.item()`): on a GPU backend that is the step's only host sync.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from tinynn import checkpoint, distributed, generate, hf, memory, precision, registry, rng
from tinynn import tokenizer as tokenizers
from tinynn.config import TrainConfig, to_dict
from tinynn.data import Batches, training_data
from tinynn.errors import TinynnError, TinynnNotice
from tinynn.model import GPT, Architecture
from tinynn.optim import AdamW, cosine_lr, decay_groups
from tinynn.rundir import Keeper, RunDir
from tinynn.tensor import no_grad
from tinynn.train_step import TrainStep

CHECKPOINT_NAME = "ckpt.safetensors"


@dataclass
class TrainResult:
    model: GPT
    tokenizer: tokenizers.CharTokenizer | tokenizers.BPETokenizer
    history: dict  # step, train_loss, val_step, val_loss
    sample: str
    checkpoint: Path | None  # None: no state was good enough to write
    plot: Path | None = None  # the loss curve, where loss_plot asked for one and it was written


def evaluate(model: GPT, batches: Batches, split: str, steps: int, batch_size: int, seed: int) -> float:
    """Mean loss over `steps` batches drawn from a fixed stream (the same batches at every evaluation)."""
    eval_rng = np.random.default_rng(seed)
    model.eval()
    with no_grad():
        total = sum(model(*batches.sample(split, batch_size, eval_rng))[1].item() for _ in range(steps))
    model.train()
    return total / steps


def train(cfg: TrainConfig | dict, *, device=None, resume=False, overwrite=False, progress=True) -> TrainResult:
    """Train as `cfg` says (a TrainConfig, or a dict of the JSON config's keys, checked alike). Everything checkable is checked before step 1 (see rundir.py and memory.py), the
    data before the device is started; `resume` continues out_dir's checkpoint, `overwrite` lets a fresh run
    replace it. Ctrl-C ends the step under way and saves it (see `_Interrupts`). Under mpiexec, rank 0 alone
    holds out_dir, evaluates, writes checkpoints and samples."""
    if isinstance(cfg, dict):
        from tinynn import config
        cfg = config.from_dict(cfg, source="train(config)")
    cfg.validate()
    if resume and overwrite:
        raise TinynnError("--resume continues out_dir's checkpoint and --overwrite replaces it: give one of them")
    before = precision.chosen()  # a config's matmul_precision holds for its run alone
    if cfg.matmul_precision is not None:
        precision.set_matmul_precision(cfg.matmul_precision)
    try:
        return _train(cfg, device, resume, overwrite, progress)
    finally:
        precision.set_matmul_precision(before)


def _train(cfg: TrainConfig, device, resume: bool, overwrite: bool, progress: bool) -> TrainResult:
    world = distributed.world()  # under mpiexec: this rank (before the backend, which picks its GPU by it)
    world.check_batch(cfg.batch_size, cfg.grad_accum_steps)
    if cfg.loss_plot and world.is_root:
        check_plot_path(cfg.loss_plot)
    run_dir = RunDir(cfg.out_dir, CHECKPOINT_NAME)
    pretrained = None
    if cfg.init_from:
        pretrained = hf.load(cfg.init_from, cfg.vocab_multiple)
        cfg = _adopt(cfg, pretrained)
    saved = checkpoint.load(run_dir.checkpoint) if resume else None
    if saved:
        _check_resumable(saved, cfg, run_dir.checkpoint)
        fixed, fixed_source = tokenizers.from_spec(saved["tokenizer"]), f"checkpoint {run_dir.checkpoint}"
    elif pretrained:
        fixed, fixed_source = pretrained.tokenizer, f"GPT-2 folder {cfg.init_from}"
        if fixed is None and not (cfg.tokenizer or "").endswith(".json"):
            raise TinynnError(f"GPT-2 folder {cfg.init_from} has no tokenizer.json: name the one its ids are of "
                              "(the tokenizer key)")
    else:
        fixed, fixed_source = None, ""
    data = training_data(cfg.data, cfg.tokenizer, cfg.vocab_size, cfg.block_size, cfg.val_fraction, fixed=fixed,
                         fixed_source=fixed_source, progress=progress and world.is_root)
    tokenizer, batches = data.tokenizer, data.batches
    vocab_size = pretrained.config["vocab_size"] if pretrained else tokenizer.vocab_size
    backend = registry.set_default(device)  # after the data: a bad file is reported without starting a GPU
    memory.check(cfg, vocab_size, data.in_memory, backend=backend)
    try:  # checked now, not after the training it would end
        prompt = tokenizer.encode(cfg.sample_prompt) if cfg.sample_prompt else data.first
    except TinynnError as e:
        raise TinynnError(f"sample_prompt: {e}") from None
    if world.is_root:
        run_dir.claim(resume=resume, overwrite=overwrite)
    try:
        if world.is_root:
            run_dir.check_disk(memory.checkpoint_bytes(cfg, vocab_size))
        model, history, ckpt_path = _train_loop(cfg, backend, world, tokenizer, vocab_size, batches, saved,
                                                pretrained, run_dir, progress)
    finally:
        run_dir.release()
    if not world.is_root:  # rank 0 alone samples and plots
        return TrainResult(model, tokenizer, history, "", ckpt_path)
    try:
        sampler = generate.for_tokenizer(model, tokenizer.vocab_size, "the sample")
        tokens = sampler.stream(prompt[None, :], cfg.sample_tokens, temperature=0.8, seed=cfg.seed % 2**32)  # 32-bit
        drawn = list(tqdm(tokens, total=cfg.sample_tokens, desc="sample", unit="token", leave=False,
                          disable=not progress, dynamic_ncols=True))  # minutes on a software adapter
        out = np.concatenate([prompt[None, :], *(t[:, None] for t in drawn)], axis=1)
    except KeyboardInterrupt:
        raise Interrupted(f"while sampling, after training: the checkpoint is in {ckpt_path}") from None
    sample = tokenizer.decode(out[0])
    plot = None
    if cfg.loss_plot:
        try:
            plot = plot_history(history, cfg.loss_plot)
        except OSError as e:  # checked before training, so rare (a disk filled up since): the checkpoint stands
            warnings.warn(f"loss_plot {cfg.loss_plot!r} not written ({e.strerror or e}); the checkpoint is saved",
                          TinynnNotice)
    return TrainResult(model, tokenizer, history, sample, ckpt_path, plot)


def _train_loop(cfg, backend, world, tokenizer, vocab_size, batches, saved, pretrained, run_dir, progress):
    rng.manual_seed(cfg.seed)
    model = GPT(cfg.model_config(vocab_size))
    if pretrained and not saved:
        model.load_state_dict({**pretrained.state, "wpe.weight": pretrained.state["wpe.weight"][:cfg.block_size]})
    optimizer = AdamW(decay_groups(list(model.named_parameters()), cfg.weight_decay), lr=cfg.learning_rate,
                      betas=(cfg.beta1, cfg.beta2), max_grad_norm=cfg.grad_clip)
    history = {key: [] for key in checkpoint.HISTORY}
    start = 0
    if saved:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        rng.set_state(saved["rng_state"])
        start, history = saved["step"], saved["history"]
    keeper = Keeper(run_dir.checkpoint, history, start if saved else None)

    def state(step):
        return {"model_state": model.state_dict(), "optimizer_state": optimizer.state_dict(), "config": to_dict(cfg),
                "tokenizer": tokenizer.spec(), "step": step, "rng_state": rng.get_state(), "history": history,
                "vocab_size": vocab_size}

    split_for_eval = "val" if batches.has_val else "train"
    tokens_per_step = cfg.batch_size * cfg.block_size
    bar = tqdm(range(start, cfg.max_steps), initial=start, total=cfg.max_steps,
               disable=not (progress and world.is_root), desc=f"train ({backend.name})", unit="step",
               dynamic_ncols=True)
    train_step = TrainStep(model, optimizer, cfg.batch_size // world.size, cfg.block_size, cfg.grad_accum_steps,
                           world)
    t_last = time.perf_counter()
    done, running = start, start  # the step whose state the model holds (None inside a step, where an update
    # may be half made), and the step under way
    try:
        with _Interrupts(world.is_root, terminate=world.size == 1) as interrupts:
            for step in bar:
                done, running = None, step + 1
                lr = cosine_lr(step, cfg.learning_rate, cfg.min_lr, cfg.warmup_steps, cfg.max_steps)
                x, y = batches.sample("train", cfg.batch_size, rng.generator())
                loss_value = train_step(world.rows(x), world.rows(y), lr).item()  # the global batch's mean loss
                keeper.judge(loss_value, "train")  # this loss was computed on the weights offered last step
                if not math.isfinite(loss_value):
                    bar.close()
                    raise TinynnError(f"loss became {loss_value} at step {step + 1}; stopping ({_kept(keeper)}); "
                                      "try a lower learning_rate or a grad_clip")
                history["step"].append(step + 1)
                history["train_loss"].append(loss_value)
                done = step + 1
                now = time.perf_counter()
                bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{tokens_per_step / max(now - t_last, 1e-9):,.0f}")
                t_last = now
                last = step + 1 == cfg.max_steps
                val = None
                if world.is_root and ((step + 1) % cfg.eval_interval == 0 or last):
                    bar.set_postfix_str(f"step {step + 1}: evaluating on {cfg.eval_steps} batches")  # slow on a CPU
                    val = evaluate(model, batches, split_for_eval, cfg.eval_steps, cfg.batch_size, cfg.seed + 1)
                    history["val_step"].append(step + 1)
                    history["val_loss"].append(val)
                    _report(bar, f"step {step + 1}: train loss {loss_value:.4f}, " + (
                        f"val loss {val:.4f}" if split_for_eval == "val" else
                        f"evaluated on training batches {val:.4f} (no validation split)"))
                if world.is_root and ((cfg.checkpoint_interval and (step + 1) % cfg.checkpoint_interval == 0)
                                      or last):
                    keeper.offer(state(step + 1))
                if val is not None:  # evaluated on the weights just offered
                    train_loss = None
                    if keeper.wants_train_loss:
                        train_loss = val if split_for_eval == "train" else \
                            evaluate(model, batches, "train", cfg.eval_steps, cfg.batch_size, cfg.seed + 2)
                    keeper.judge(val, "val", train_loss)
                interrupts.check()
    except KeyboardInterrupt:
        bar.close()
        if not world.is_root:
            raise
        try:
            said = _save_on_interrupt(keeper, done, running, start, state, model, batches, cfg)
        except KeyboardInterrupt:  # a second Ctrl-C while saving: the file before stands (saves are atomic)
            said = f"while saving: step {keeper.saved_step}'s checkpoint is in {keeper.path}; continue it with " \
                "--resume" if keeper.saved_step else "while saving: no checkpoint was saved"
        raise Interrupted(said) from None
    bar.close()
    return model, history, keeper.finish()


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) ended the run; the message says which checkpoint is on disk, and how to go on."""


class _Interrupts:
    """Ctrl-C (SIGINT), and in a run of one process SIGTERM (`kill`, a job scheduler stopping the job), take
    effect at the end of the step under way (`check`), whose state is then saved: an interrupt inside a step
    could leave the weights half updated, and those are never saved. A second one takes effect at once. Ctrl-C's
    deferred handler is the one in place (Python's, or distributed.py's, which also ends an MPI job); SIGTERM is
    taken over only from the default, which ends the process with nothing saved since the last checkpoint (under
    MPI the launcher ends the job its own way). The main thread alone receives signals, so elsewhere nothing is
    deferred."""

    def __init__(self, enabled: bool, terminate: bool = False):
        self.enabled, self.terminate, self.previous, self.pending = enabled, terminate, {}, None

    def __enter__(self):
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            return self
        if callable(signal.getsignal(signal.SIGINT)):
            self.previous[signal.SIGINT] = signal.getsignal(signal.SIGINT)
        if self.terminate and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self.previous[signal.SIGTERM] = signal.SIG_DFL
        for signum in self.previous:
            signal.signal(signum, self._defer)
        return self

    def _defer(self, signum, frame):
        if self.pending is not None:
            self._stop(signum, frame)
        self.pending = (signum, frame)
        again = "Ctrl-C again" if signum == signal.SIGINT else "SIGTERM again"
        distributed.say(f"tinynn: stopping after this step ({again} to stop at once)")

    def _stop(self, signum, frame):
        if signum == signal.SIGTERM:
            raise KeyboardInterrupt  # then ends as Ctrl-C does
        self.previous[signum](signum, frame)  # Python's raises KeyboardInterrupt, as distributed.py's does on rank 0

    def check(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self._stop(*pending)

    def __exit__(self, kind, *exc):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        if kind is None:  # an interrupt after the last step's check
            self.check()


def _save_on_interrupt(keeper: Keeper, done, running, start, state, model, batches, cfg) -> str:
    """Write the state at the step the interrupt ended (`done`; None inside step `running`), judged like any
    other by a training loss measured on it, and say what is on disk."""
    at = f"at step {done}" if done is not None else f"during step {running}"
    if done is not None and done > start and keeper.saved_step != done:
        keeper.offer(state(done))
        keeper.judge(evaluate(model, batches, "train", 1, cfg.batch_size, cfg.seed + 2), "train")
    try:
        path = keeper.finish()
    except TinynnError as e:  # a state out_dir could not take, rescued elsewhere (or lost): the error says where
        return f"{at}: {e}"
    if path is None:
        return f"{at}: no checkpoint was saved"
    return f"{at}: step {keeper.saved_step}'s checkpoint is in {path}; continue it with --resume"


def _report(bar, line: str) -> None:
    """A line of the run's report on stdout. A reader that has gone (`tinynn train ... | head -1`) does not
    end the training: the rest of the output is dropped."""
    try:
        bar.write(line)
    except BrokenPipeError:
        drop_stdout()


def drop_stdout() -> None:
    """Send the rest of stdout to os.devnull once its reader has gone, so that later prints (and Python's flush
    at exit) do not raise BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _kept(keeper: Keeper) -> str:
    try:
        path = keeper.finish()
    except TinynnError as e:
        return str(e)
    return f"the last good checkpoint {path} (step {keeper.saved_step}) is kept" if path else "no checkpoint was saved"


# what a step's update depends on besides the model and the state a checkpoint holds: a resume that changes one
# goes on differently from the run it continues (max_steps is left out: raising it is how a run is extended)
TRAJECTORY = ("batch_size", "grad_accum_steps", "learning_rate", "min_lr", "warmup_steps", "weight_decay", "beta1",
              "beta2", "grad_clip", "data", "val_fraction", "matmul_precision")


def _check_resumable(saved: dict, cfg: TrainConfig, path: Path) -> None:
    """The checkpoint's model must be the config's; steps must be left to train; settings that change the
    updates are named in a notice (a lower learning rate on resume is a real choice, not a mistake)."""
    checkpoint.check_resumable(saved, path)
    saved_config = saved["config"]
    for field in dataclasses.fields(Architecture):
        before = saved_config.get(field.name, field.default)  # a field the checkpoint predates: its default
        if before != getattr(cfg, field.name):
            raise TinynnError(f"cannot resume from {path}: it has {field.name}={before!r}, "
                              f"the config says {getattr(cfg, field.name)!r}")
    if saved["step"] >= cfg.max_steps:
        raise TinynnError(f"{path} is at step {saved['step']} and max_steps is {cfg.max_steps}: nothing to train "
                          f"(raise it with --max-steps to train further)")
    changed = [f"{key} {json.dumps(saved_config[key])} -> {json.dumps(getattr(cfg, key))}" for key in TRAJECTORY
               if key in saved_config and saved_config[key] != getattr(cfg, key)]
    if changed:
        warnings.warn(f"resuming {path} with {', '.join(changed)}: from step {saved['step'] + 1} the run trains "
                      "with the new values, not as it would have gone on", TinynnNotice)


def _adopt(cfg: TrainConfig, pretrained: hf.Pretrained) -> TrainConfig:
    """The run's config with the GPT-2 folder's shape: its layers, heads, width, biases and head (tied to wte, as
    GPT-2's is, unless its config.json unties it; never with a bias); a block_size below its context keeps the
    first block_size positions (exact for sequences that long)."""
    shape = {k: pretrained.config[k] for k in ("n_layer", "n_head", "n_embd", "bias", "head_bias", "tie_embeddings")}
    if cfg.block_size > pretrained.config["block_size"]:
        raise TinynnError(f"block_size {cfg.block_size} is longer than the context of GPT-2 folder {cfg.init_from} "
                          f"({pretrained.config['block_size']})")
    # the head's layout is GPT-2's, whatever the config said: not worth a notice
    differ = [f"{k} {v}" for k, v in shape.items() if getattr(cfg, k) != v and k not in ("head_bias", "tie_embeddings")]
    if differ:
        warnings.warn(f"init_from: the model is {cfg.init_from}'s ({', '.join(differ)}), not the config's",
                      TinynnNotice)
    return dataclasses.replace(cfg, **shape)


def check_plot_path(path: str) -> None:
    """loss_plot is written after training; what would stop it then is an error now: no matplotlib, a format it
    cannot write, a folder, a place that cannot take a file."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise TinynnError("loss_plot needs matplotlib: pip install 'tinynn-core[plot]'") from None
    p = Path(path)
    if p.is_dir():
        raise TinynnError(f"loss_plot {path!r} is a folder: name a file in it (e.g. {str(p / 'loss.png')!r})")
    formats = FigureCanvasAgg.get_supported_filetypes()
    if p.suffix.lstrip(".").lower() not in formats:
        raise TinynnError(f"loss_plot {path!r} must end in a format matplotlib writes "
                          f"({', '.join('.' + f for f in sorted(formats))})")
    folder = p.parent
    while not folder.exists():  # plot_history creates the folders missing
        folder = folder.parent
    try:
        if not folder.is_dir():
            raise NotADirectoryError(20, f"{folder} is a file")
        if p.exists():
            open(p, "ab").close()  # opened for writing, left as it is
        else:
            tempfile.NamedTemporaryFile(dir=folder, prefix=f".{p.name}.").close()
    except OSError as e:
        raise TinynnError(f"loss_plot {path!r} cannot be written ({e.strerror or e})") from None


def plot_history(history: dict, path: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(history["step"], history["train_loss"], label="train", linewidth=0.8)
    if history["val_step"]:
        ax.plot(history["val_step"], history["val_loss"], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return Path(path)
