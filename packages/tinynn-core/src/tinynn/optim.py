"""Optimizers (SGD with momentum, AdamW) and the warmup + cosine learning-rate schedule.

Updates run in place on the backend, one call per parameter group. A step has two halves: `prepare_step`
(host: advance the count, write the learning rate and bias corrections into a small backend array) and
`apply_step` (backend only: the updates, which read that array). `step()` runs both; a captured training
step (train.py) runs the first outside the capture and the second inside it.
Gradient-norm clipping is an optimizer option: the norm and the clip coefficient stay on the backend (no
host sync), and the coefficient scales the gradients inside the update.
"""
from __future__ import annotations

import math

import numpy as np

from tinynn.errors import TinynnError
from tinynn.tensor import Tensor

_UNSHARED = frozenset(("params", "weight_decay", "hyper"))  # what groups updated in one run may differ in
_MISSING = object()


class Optimizer:
    def __init__(self, params, defaults: dict, max_grad_norm: float | None):
        params = list(params)
        if params and isinstance(params[0], Tensor):
            params = [{"params": params}]
        self.groups = [{**defaults, **group, "params": list(group["params"])} for group in params]
        self.max_grad_norm = max_grad_norm
        self.steps = 0
        self.state: dict[int, list] = {}  # id(param) -> its buffers
        self.last_grad_norm: Tensor | None = None  # set by step() when clipping; read it only when logging

    @property
    def params(self) -> list[Tensor]:
        return [p for g in self.groups for p in g["params"]]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def set_lr(self, lr: float) -> None:
        for g in self.groups:
            g["lr"] = lr

    def step(self):
        self.prepare_step()
        self.apply_step()

    def prepare_step(self):
        """Advance the step count and write the per-step values of each run of groups updated together to
        the array of its first group (the one its update reads)."""
        self.steps += 1
        for run in self._update_runs():
            g = run[0]
            p, hyper = g["params"][0], g.get("hyper")
            be = p.backend
            values = np.array(self._per_step_values(g), p.data.dtype)
            if hyper is None or hyper[0] is not be:
                g["hyper"] = (be, be.from_numpy(values))
            else:
                be.write_(hyper[1], values)

    def guard_key(self) -> tuple:
        """What a captured step (train.py's TrainStep) fixes when it records: each group's hyperparameters but
        the learning rate (written every step), with the (backend, array) of its per-step values; the clipping
        norm, the state's arrays, and how the groups fall into runs updated together. Compared by value,
        arrays by identity. A captured step computes it before every replay, on its critical path (between
        the last read-back and the GPU's next start), so it is kept to C-level copies: each group's dict
        copied, each parameter's state list as a tuple (a copy: a buffer swapped into a list is seen)."""
        groups = []
        for g in self.groups:
            fixed = g.copy()
            del fixed["params"]  # its arrays are the model's (TrainStep keys them); its state is keyed below
            fixed.pop("lr", None)
            groups.append(fixed)
        runs = tuple(len(run) for run in self._update_runs())
        return self.max_grad_norm, tuple(groups), tuple(map(tuple, self.state.values())), runs

    def _update_runs(self) -> list[list[dict]]:
        """The groups with parameters, in runs updated by one call that share their per-step values: by
        default each group alone."""
        return [[g] for g in self.groups if g["params"]]

    def _buffers(self, p: Tensor, count: int) -> list:
        if id(p) not in self.state:
            self.state[id(p)] = [p.backend.full(p.shape, 0.0, p.dtype) for _ in range(count)]
        return self.state[id(p)]

    def _grad_scale(self):
        """The clip coefficient min(1, max_norm / ||g||) as a backend scalar, or None without clipping."""
        if self.max_grad_norm is None:
            return None
        with_grad = [p for p in self.params if p.grad is not None]
        if not with_grad:
            return None
        be = with_grad[0].backend
        norm, coefficient = be.global_norm_and_clip([p.grad.data for p in with_grad], self.max_grad_norm)
        self.last_grad_norm = Tensor(norm, be)
        return coefficient

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {"steps": np.asarray([self.steps])}
        for i, p in enumerate(self.params):
            for j, buf in enumerate(self.state.get(id(p), [])):
                out[f"{i}.{j}"] = p.backend.to_numpy(buf)
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.steps = int(state["steps"].reshape(-1)[0])
        self.state.clear()
        for i, p in enumerate(self.params):
            bufs = [state[f"{i}.{j}"] for j in range(self.n_buffers) if f"{i}.{j}" in state]
            if not bufs:
                continue
            if len(bufs) != self.n_buffers or any(tuple(b.shape) != p.shape for b in bufs):
                raise TinynnError(f"optimizer state for parameter {i} does not match its shape {p.shape}")
            self.state[id(p)] = [p.backend.from_numpy(b.astype(p.dtype)) for b in bufs]


class SGD(Optimizer):
    n_buffers = 1

    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0, max_grad_norm=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay), max_grad_norm)

    def _per_step_values(self, group):
        return [group["lr"]]

    def apply_step(self):
        scale = self._grad_scale()
        for (g,) in self._update_runs():
            ps = [p for p in g["params"] if p.grad is not None]
            if ps:
                ps[0].backend.sgd_update_([p.data for p in ps], [p.grad.data for p in ps],
                                          [self._buffers(p, 1)[0] for p in ps], g["hyper"][1],
                                          momentum=g["momentum"], weight_decay=g["weight_decay"], grad_scale=scale)


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019)."""
    n_buffers = 2

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, max_grad_norm=None):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay), max_grad_norm)

    def _update_runs(self) -> list[list[dict]]:
        """Neighbouring groups that differ only in weight decay (nanoGPT's two) in one run: they share their
        learning rate, so their per-step values, and one update (one GPU dispatch) takes the decay per
        parameter."""
        runs = []
        for g in (g for g in self.groups if g["params"]):
            if runs and _same_but_decay(runs[-1][0], g):
                runs[-1].append(g)
            else:
                runs.append([g])
        return runs

    def _per_step_values(self, group):
        beta1, beta2 = group["betas"]
        return [group["lr"], 1.0 - beta1**self.steps, 1.0 - beta2**self.steps]

    def apply_step(self):
        scale = self._grad_scale()
        for run in self._update_runs():  # groups differing only in weight decay: one update (one GPU dispatch)
            pairs = [(p, g["weight_decay"]) for g in run for p in g["params"] if p.grad is not None]
            if not pairs:
                continue
            ps = [p for p, _ in pairs]
            bufs = [self._buffers(p, 2) for p in ps]
            g = run[0]
            ps[0].backend.adamw_update_(
                [p.data for p in ps], [p.grad.data for p in ps], [b[0] for b in bufs], [b[1] for b in bufs],
                g["hyper"][1], beta1=g["betas"][0], beta2=g["betas"][1], eps=g["eps"],
                weight_decay=[decay for _, decay in pairs], grad_scale=scale)


def _same_but_decay(a: dict, b: dict) -> bool:
    for k in a.keys() | b.keys():  # every step (prepare_step, guard_key): no dicts made
        if k not in _UNSHARED and a.get(k, _MISSING) != b.get(k, _MISSING):
            return False
    return True


def cosine_lr(step: int, base_lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Linear warmup to base_lr over warmup_steps, then cosine decay to min_lr at max_steps."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def decay_groups(named_params, weight_decay: float) -> list[dict]:
    """nanoGPT's grouping: weight decay on matrices (dim >= 2), none on biases and LayerNorm gains."""
    decay = [p for _, p in named_params if p.ndim >= 2]
    no_decay = [p for _, p in named_params if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
