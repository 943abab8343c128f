"""`TrainStep`: one optimisation step (forward, backward, optimizer update) over persistent input arrays, which
a backend may capture once and replay; with gradient accumulation over micro-batches and, under MPI, the
gradients summed over the ranks. train.py's loop calls it once per step.
"""
from __future__ import annotations

import math

import numpy as np

from tinynn import distributed, precision, registry
from tinynn.errors import TinynnError
from tinynn.model import GPT
from tinynn.nn import Module
from tinynn.tensor import Tensor

REDUCE_PARTS = 8  # the flat gradients' parts, pipelined on a GPU (tinynn_gpu/host_reduce.py); 4 to 16 did alike


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
        return self.model.training, self.shape, precision.current(), tuple(p.data for p in self.model_params)

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
            if seed is None and self.scale != 1.0:  # made on the device: no upload in the step
                seed = Tensor(self.backend.full(loss.shape, self.scale, loss.dtype), self.backend)
            loss.backward(seed)  # at scale 1, backward()'s own seed, which the fused classifier needs no multiply for
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
        x, y = np.asarray(x), np.asarray(y)
        shape = x.shape
        if len(shape) != 2 or y.shape != shape:
            raise TinynnError(f"a batch is x and y of one (batch, time) shape, got {shape} and {y.shape}")
        if shape[0] % k:
            raise TinynnError(f"a batch of {shape[0]} rows does not split into {k} equal micro-batches")
        if shape != self.shape or self.model_params[0].backend is not self.backend:
            self._inputs(shape)
        be = self.backend
        parts = zip(np.split(x, k), np.split(y, k))
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
