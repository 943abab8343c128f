"""The training loop: `train(config)` builds the data, model and optimizer, runs the steps with a progress
bar, evaluates, checkpoints, and ends with a sample. The CLI's `tinynn train` is a thin wrapper around it.

A step reads the loss back once (`loss.item()`): on a GPU backend that is the step's only host sync.
"""
from __future__ import annotations

import dataclasses
import math
import operator
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from tinynn import checkpoint, distributed, memory, registry, rng
from tinynn.config import TrainConfig, to_dict
from tinynn.data import Batches, CharTokenizer, load_text
from tinynn.errors import TinynnError
from tinynn.model import GPT, GPTConfig
from tinynn.nn import Module
from tinynn.optim import AdamW, cosine_lr, decay_groups
from tinynn.rundir import Keeper, RunDir
from tinynn.tensor import Tensor, no_grad

CHECKPOINT_NAME = "ckpt.safetensors"
_DATA = operator.attrgetter("data")
REDUCE_PARTS = 8  # the flat gradients' parts, pipelined on a GPU (tinynn_gpu/host_reduce.py); 4 to 16 did alike


@dataclass
class TrainResult:
    model: GPT
    tokenizer: CharTokenizer
    history: dict  # step, train_loss, val_step, val_loss
    sample: str
    checkpoint: Path


class TrainStep:
    """One optimisation step over persistent input arrays, so that a backend can capture it once and replay
    it (the GPU backend does: see `Backend.capture`). Call it with a batch and the learning rate; it returns
    the loss, still on the backend: reading it (`.item()`) is the step's one host sync. A batch of another
    (B, T) shape gets new input arrays, and a moved model a new backend: either way the step is captured
    again, as it is when anything in `_guard_key` changes (one shape is kept: batches that alternate between
    shapes are recorded anew at every switch).

    With `accum_steps` k the batch is split into k micro-batches whose gradients add up before the one
    optimizer step; each backward starts from 1/k, so the sum is the gradient of the whole batch's mean loss.

    With a `world` of several MPI ranks (distributed.py) each rank passes its rows of the global batch and
    its backward starts from 1/(k * ranks). The step then runs in two captured halves around one host round
    trip: the loss and every gradient packed into one flat array, read back, summed over the ranks (a
    persistent Allreduce per part: a GPU backend overlaps one part's sum with the others' transfers),
    written back, unpacked into the gradients the optimizer (and its clipping) reads.
    The returned loss is then the global batch's mean, already on the host.
    """

    def __init__(self, model: GPT, optimizer, batch_size: int, block_size: int, accum_steps: int = 1,
                 world: distributed.World | None = None):
        self.model, self.optimizer = model, optimizer
        # walked again only when a module's attribute is assigned (_backward_key)
        self.model_params = model.parameters()
        self.model_structure = Module.structure_changes
        self.world = world if world is not None and world.size > 1 else None
        self.accum_steps = accum_steps
        self.scale = 1.0 / (accum_steps * (self.world.size if self.world else 1))
        self._inputs((batch_size, block_size))

    def _inputs(self, shape):
        """Input arrays for batches of `shape` on the model's backend, and the step captured over them."""
        self.backend = be = self.model_params[0].backend
        self.shape = shape
        micro = np.zeros((shape[0] // self.accum_steps, shape[1]), np.int64)  # (b, T) token ids of one micro-batch
        self.inputs = [(Tensor(be.from_numpy(micro), be), Tensor(be.from_numpy(micro), be))
                       for _ in range(self.accum_steps)]
        if self.world is None:
            self._run = be.capture(self._step, key=self._guard_key)
        else:
            self.params = self.optimizer.params
            shapes = [()] + [p.shape for p in self.params]  # the loss, then every gradient
            self.flat = Tensor(be.full((sum(math.prod(s) for s in shapes),), 0.0), be)
            self.host = np.zeros(self.flat.shape, np.float32)  # read back into, summed and written from
            ends = np.linspace(0, self.host.size, min(REDUCE_PARTS, self.host.size) + 1).astype(int).tolist()
            for *_, summation in getattr(self, "parts", ()):  # a new batch shape: the old parts go
                summation.free()
            self.parts = [(a, b, self.world.summation(self.host[a:b])) for a, b in zip(ends[:-1], ends[1:])]
            self._pack = be.capture(self._packed_gradients, key=self._backward_key, copy_result=False)  # read at once
            self._update = be.capture(lambda: self._unpacked_update(shapes), key=self._guard_key)

    def _backward_key(self):
        """What the captured forward and backward depend on besides the values in their arrays: the parameters
        walked again when a module, tensor or list was assigned to any module since the last walk (a new head, say)."""
        if Module.structure_changes != self.model_structure:
            self.model_params, self.model_structure = self.model.parameters(), Module.structure_changes
        return self.model.training, self.shape, tuple(map(_DATA, self.model_params))

    def _guard_key(self):
        """... and a whole step, its update too."""
        return self._backward_key(), self.optimizer.guard_key()

    def _backward(self):
        """Forward and backward over every micro-batch: the gradients add up in `.grad`. Returns the loss
        scaled as the gradients are (the batch's mean loss in a single process)."""
        self.optimizer.zero_grad()
        seed, losses = None, []
        for x, y in self.inputs:
            _, loss = self.model(x, y)
            if seed is None:  # made on the device: no upload in the step
                seed = Tensor(self.backend.full(loss.shape, self.scale, loss.dtype), self.backend)
            loss.backward(seed)
            losses.append(loss.detach())
        if self.scale == 1.0:
            return losses[0]
        return sum(losses[1:], losses[0]) * self.scale

    def _step(self):
        loss = self._backward()
        self.optimizer.apply_step()
        return loss

    def _packed_gradients(self):
        loss = self._backward()
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:
            raise TinynnError(f"data-parallel training needs a gradient for every parameter; "
                              f"parameter {missing[0]} got none")
        return Tensor(self.backend.pack([loss.data] + [p.grad.data for p in self.params]), self.backend)

    def _unpacked_update(self, shapes):
        _, *grads = self.backend.unpack(self.flat.data, shapes)  # the loss came back with the read-back
        for p, g in zip(self.params, grads):
            p.grad = Tensor(g, self.backend)
        self.optimizer.apply_step()

    def __call__(self, x: np.ndarray, y: np.ndarray, lr: float):
        k = len(self.inputs)
        shape = _shape(x)
        if len(shape) != 2 or _shape(y) != shape:
            raise TinynnError(f"a batch is x and y of one (batch, time) shape, got {shape} and {_shape(y)}")
        if shape[0] % k:
            raise TinynnError(f"a batch of {shape[0]} rows does not split into {k} equal micro-batches")
        if shape != self.shape or self.model_params[0].backend is not self.backend:
            self._inputs(shape)
        be = self.backend
        parts = zip(np.split(x, k), np.split(y, k)) if k > 1 else [(x, y)]  # (np.split costs 3 us a call)
        for (x_in, y_in), (x_part, y_part) in zip(self.inputs, parts):
            be.write_(x_in.data, x_part)
            be.write_(y_in.data, y_part)
        self.optimizer.set_lr(lr)
        if self.world is None:
            self.optimizer.prepare_step()
            return self._run()
        # the step's read-back (and its host sync), sum over the ranks and write, in pipelined parts; each
        # rank's share carries its 1/ranks, so the sum is the global mean
        be.reduce_on_host_(self._pack().data, self.flat.data, self.host, self.parts, in_thread=self.world.threaded)
        self.optimizer.prepare_step()
        self._update()
        cpu = registry.reference()
        return Tensor(cpu.from_numpy(self.host[0]), cpu)


def _shape(a) -> tuple:
    """np.shape(a), read straight off an ndarray. A synced step's host time until its first submission is GPU idle
    time, and there the code runs cold (after the read-back's wait): np.shape took 0.2 us warm and 9 us after a 64 MB
    cache sweep (2-core CPU), an attribute read a fraction of that."""
    return a.shape if a.__class__ is np.ndarray else np.shape(a)


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
    text = load_text(cfg.data)
    saved = checkpoint.load(run_dir.checkpoint) if resume else None
    tokenizer = CharTokenizer(saved["chars"] if saved else text)
    if saved:
        _check_same_model(saved["config"], cfg, run_dir.checkpoint)
    memory.check(cfg, tokenizer.vocab_size, len(text), on_device=backend.is_gpu)
    tokens = tokenizer.encode(text)
    batches = Batches(tokens, cfg.block_size, cfg.val_fraction)
    try:  # checked now, not after the training it would end
        prompt = tokenizer.encode(cfg.sample_prompt) if cfg.sample_prompt else tokens[:1]
    except TinynnError as e:
        raise TinynnError(f"sample_prompt: {e}") from None
    if world.is_root:
        run_dir.claim(resume=resume, overwrite=overwrite)
    try:
        if world.is_root:
            run_dir.check_disk(memory.checkpoint_bytes(cfg, tokenizer.vocab_size))
        model, history, ckpt_path = _train_loop(cfg, backend, world, tokenizer, batches, saved, run_dir, progress)
    finally:
        run_dir.release()
    if not world.is_root:  # rank 0 alone samples and plots
        return TrainResult(model, tokenizer, history, "", ckpt_path)
    out = model.generate(prompt[None, :], cfg.sample_tokens, temperature=0.8, seed=cfg.seed % 2**32)  # 32-bit
    sample = tokenizer.decode(out[0])
    if cfg.loss_plot:
        plot_history(history, cfg.loss_plot)
    return TrainResult(model, tokenizer, history, sample, ckpt_path)


def _train_loop(cfg, backend, world, tokenizer, batches, saved, run_dir, progress):
    rng.manual_seed(cfg.seed)
    model = GPT(cfg.model_config(tokenizer.vocab_size))
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
                "chars": tokenizer.chars, "step": step, "rng_state": rng.get_state(), "history": history}

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
    for field in dataclasses.fields(GPTConfig):
        if field.name != "vocab_size" and saved_config.get(field.name) != getattr(cfg, field.name):
            raise TinynnError(f"cannot resume from {path}: it has {field.name}={saved_config.get(field.name)!r}, "
                              f"the config says {getattr(cfg, field.name)!r}")


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
