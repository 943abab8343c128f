"""The training loop: `train(config)` builds the data, model and optimizer, runs the steps (train_step.py)
with a progress bar, evaluates, checkpoints, and ends with a sample and, where asked, a plot of the losses.
The CLI's `tinynn train` is a thin wrapper around it.

A step reads the loss back once (`loss.item()`): on a GPU backend that is the step's only host sync.
"""
from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from tinynn import checkpoint, distributed, hf, memory, registry, rng
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
    checkpoint: Path


def evaluate(model: GPT, batches: Batches, split: str, steps: int, batch_size: int, seed: int) -> float:
    """Mean loss over `steps` batches drawn from a fixed stream (the same batches at every evaluation)."""
    eval_rng = np.random.default_rng(seed)
    model.eval()
    with no_grad():
        total = sum(model(*batches.sample(split, batch_size, eval_rng))[1].item() for _ in range(steps))
    model.train()
    return total / steps


def train(cfg: TrainConfig, *, device=None, resume=False, overwrite=False, progress=True) -> TrainResult:
    """Train as `cfg` says. Everything checkable is checked before step 1 (see rundir.py and memory.py);
    `resume` continues out_dir's checkpoint, `overwrite` lets a fresh run replace it. Under mpiexec, rank 0
    alone holds out_dir, evaluates, writes checkpoints and samples."""
    cfg.validate()
    world = distributed.world()  # under mpiexec: this rank (before the backend, which picks its GPU by it)
    world.check_batch(cfg.batch_size, cfg.grad_accum_steps)
    backend = registry.set_default(device)
    if cfg.loss_plot:
        _require_matplotlib()
    run_dir = RunDir(cfg.out_dir, CHECKPOINT_NAME)
    pretrained = None
    if cfg.init_from:
        pretrained = hf.load(cfg.init_from)
        cfg = _adopt(cfg, pretrained)
    saved = checkpoint.load(run_dir.checkpoint) if resume else None
    if saved:
        _check_same_model(saved["config"], cfg, run_dir.checkpoint)
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
    memory.check(cfg, vocab_size, data.in_memory, on_device=backend.is_gpu)
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
    out = model.generate(prompt[None, :], cfg.sample_tokens, temperature=0.8, seed=cfg.seed % 2**32)  # 32-bit
    sample = tokenizer.decode(out[0])
    if cfg.loss_plot:
        plot_history(history, cfg.loss_plot)
    return TrainResult(model, tokenizer, history, sample, ckpt_path)


def _train_loop(cfg, backend, world, tokenizer, vocab_size, batches, saved, pretrained, run_dir, progress):
    rng.manual_seed(cfg.seed)
    model = GPT(cfg.model_config(vocab_size))
    if pretrained and not saved:
        model.load_state_dict({**pretrained.state, "wpe.weight": pretrained.state["wpe.weight"][:cfg.block_size]})
    optimizer = AdamW(decay_groups(list(model.named_parameters()), cfg.weight_decay), lr=cfg.learning_rate,
                      betas=(cfg.beta1, cfg.beta2), max_grad_norm=cfg.grad_clip)
    history = {"step": [], "train_loss": [], "val_step": [], "val_loss": []}
    start = 0
    if saved:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        rng.set_state(saved["rng_state"])
        start, history = saved["step"], saved["history"]
    keeper = Keeper(run_dir.checkpoint, history, start if saved else None)

    def state(step):
        return {"model_state": model.state_dict(), "optimizer_state": optimizer.state_dict(), "config": to_dict(cfg),
                "tokenizer": tokenizer.spec(), "step": step, "rng_state": rng.get_state(), "history": history}

    split_for_eval = "val" if batches.has_val else "train"
    tokens_per_step = cfg.batch_size * cfg.block_size
    bar = tqdm(range(start, cfg.max_steps), initial=start, total=cfg.max_steps,
               disable=not (progress and world.is_root), desc=f"train ({backend.name})", unit="step",
               dynamic_ncols=True)
    train_step = TrainStep(model, optimizer, cfg.batch_size // world.size, cfg.block_size, cfg.grad_accum_steps,
                           world)
    t_last = time.perf_counter()
    for step in bar:
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
        now = time.perf_counter()
        bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{tokens_per_step / max(now - t_last, 1e-9):,.0f}")
        t_last = now
        last = step + 1 == cfg.max_steps
        val = None
        if world.is_root and ((step + 1) % cfg.eval_interval == 0 or last):
            val = evaluate(model, batches, split_for_eval, cfg.eval_steps, cfg.batch_size, cfg.seed + 1)
            history["val_step"].append(step + 1)
            history["val_loss"].append(val)
            bar.write(f"step {step + 1}: train loss {loss_value:.4f}, {split_for_eval} loss {val:.4f}")
        if world.is_root and ((cfg.checkpoint_interval and (step + 1) % cfg.checkpoint_interval == 0) or last):
            keeper.offer(state(step + 1))
        if val is not None:
            keeper.judge(val, "val")  # evaluated on the weights just offered
    bar.close()
    return model, history, keeper.finish()


def _kept(keeper: Keeper) -> str:
    try:
        path = keeper.finish()
    except TinynnError as e:
        return str(e)
    return f"the last good checkpoint {path} (step {keeper.saved_step}) is kept" if path else "no checkpoint was saved"


def _check_same_model(saved_config: dict, cfg: TrainConfig, path: Path) -> None:
    for field in dataclasses.fields(Architecture):
        saved = saved_config.get(field.name, field.default)  # a field the checkpoint predates: its default
        if saved != getattr(cfg, field.name):
            raise TinynnError(f"cannot resume from {path}: it has {field.name}={saved!r}, "
                              f"the config says {getattr(cfg, field.name)!r}")


def _adopt(cfg: TrainConfig, pretrained: hf.Pretrained) -> TrainConfig:
    """The run's config with the GPT-2 folder's shape: its layers, heads, width and biases; a block_size below its
    context keeps the first block_size positions (exact for sequences that long)."""
    shape = {k: pretrained.config[k] for k in ("n_layer", "n_head", "n_embd", "bias")}
    shape["head_bias"] = False
    if cfg.block_size > pretrained.config["block_size"]:
        raise TinynnError(f"block_size {cfg.block_size} is longer than the context of GPT-2 folder {cfg.init_from} "
                          f"({pretrained.config['block_size']})")
    differ = [f"{k} {v}" for k, v in shape.items() if getattr(cfg, k) != v and k != "head_bias"]
    if differ:
        warnings.warn(f"init_from: the model is {cfg.init_from}'s ({', '.join(differ)}), not the config's",
                      TinynnNotice)
    return dataclasses.replace(cfg, **shape)


def _require_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise TinynnError("loss_plot needs matplotlib: pip install 'tinynn-core[plot]'") from None


def plot_history(history: dict, path: str) -> None:
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
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
