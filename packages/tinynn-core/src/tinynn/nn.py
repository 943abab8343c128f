"""Modules: parameters with a forward pass, and the generic layers (Linear, Embedding, LayerNorm, Dropout) that
models are built from (model.py builds the GPT). A Module finds its parameters and submodules in its attributes
(tensors that require grad, modules, lists of modules), in the order they were assigned. A parameter that two
modules share (a head tied to the token embedding) is one parameter, named where it is found first: the
optimizer updates it once, a state dict holds it once, and autograd sums the gradients of its two uses."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from tinynn import backends, registry, rng
from tinynn import functional as F
from tinynn.errors import TinynnError
from tinynn.tensor import Tensor


_shapes_only = False


def parameter(shape, std: float | None = None, fill: float = 0.0) -> Tensor:
    """A trainable float32 tensor of `shape` on the default backend, drawn from normal(0, std) (the seeded
    generator, rng.py), or with every element `fill` when std is None. Under `shapes_only()`: no values."""
    if _shapes_only:
        return Tensor(np.broadcast_to(np.float32(fill), shape), backends.reference(), requires_grad=True)
    values = rng.generator().normal(0.0, std, size=shape) if std is not None else np.full(shape, fill)
    backend = registry.default()
    return Tensor(backend.from_numpy(values.astype(np.float32)), backend, requires_grad=True)


@contextmanager
def shapes_only():
    """Modules built inside hold parameters of their shapes and no values (one broadcast element each): no
    memory, no draws from the generator, no backend chosen. A model's size counted from its definition, before
    the real one is built (model.parameter_count, for memory.py's estimate)."""
    global _shapes_only
    _shapes_only = True
    try:
        yield
    finally:
        _shapes_only = False


class Module:
    training = True
    # bumped by every assignment of a tensor, module, list or tuple to a module's attribute: a captured training step
    # (train.TrainStep) walks the model's parameters again when it moved (a walk costs more than its key); lists
    # changed in place (blocks.append) are not seen
    structure_changes = 0

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def __setattr__(self, name, value):
        if isinstance(value, (Tensor, Module, list, tuple)):
            Module.structure_changes += 1
        object.__setattr__(self, name, value)

    def __init_subclass__(cls, **kwargs):
        """Calling a module runs its forward: a class's own `forward` becomes its `__call__` too (no hooks run
        around it, and an eager forward calls ~30 modules, each call one Python frame fewer). A `__call__`
        written by hand, in the class or a base, is kept."""
        super().__init_subclass__(**kwargs)
        if "forward" in vars(cls) and "__call__" not in vars(cls):
            owner = next(base for base in cls.__mro__[1:] if "__call__" in vars(base))
            if owner is Module or vars(owner)["__call__"] is vars(owner).get("forward"):
                cls.__call__ = cls.forward

    def _children(self):
        for name, value in vars(self).items():
            if isinstance(value, (Tensor, Module)):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield f"{name}.{i}", item

    def named_parameters(self, prefix="", _seen=None):
        seen = set() if _seen is None else _seen  # ids of the parameters yielded: a shared one comes once
        for name, value in self._children():
            if isinstance(value, Tensor):
                if value.requires_grad and id(value) not in seen:
                    seen.add(id(value))
                    yield prefix + name, value
            else:
                yield from value.named_parameters(prefix + name + ".", seen)

    def parameters(self) -> list[Tensor]:
        return [p for _, p in self.named_parameters()]

    def modules(self):
        yield self
        for _, value in self._children():
            if isinstance(value, Module):
                yield from value.modules()

    def train(self, mode=True):
        for m in self.modules():
            m.training = mode
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def to(self, backend) -> Module:
        """Move every parameter to `backend` (an instance or a device name), keeping the same Tensor objects."""
        backend = registry.select(backend) if isinstance(backend, str) else backend
        for p in self.parameters():
            if p.backend is not backend:
                p.data, p.backend, p.grad = backend.from_numpy(p.numpy()), backend, None
        return self

    def state_dict(self) -> dict[str, np.ndarray]:
        return {name: p.numpy() for name, p in self.named_parameters()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        params = dict(self.named_parameters())
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or unexpected:
            raise TinynnError(f"state dict does not match the model: missing {missing}, unexpected {unexpected}")
        for name, p in params.items():
            if tuple(state[name].shape) != p.shape:
                raise TinynnError(f"state dict: {name} has shape {tuple(state[name].shape)}, model wants {p.shape}")
            p.backend.write_(p.data, np.asarray(state[name], dtype=p.dtype))  # in place: storage kept


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, std=0.02, weight: Tensor | None = None):
        """`weight`: a parameter (out_features, in_features) to share instead of drawing one (a tied head's)."""
        if weight is not None and weight.shape != (out_features, in_features):
            raise ValueError(f"Linear: a shared weight {weight.shape} is not ({out_features}, {in_features})")
        self.weight = parameter((out_features, in_features), std) if weight is None else weight
        self.bias = parameter((out_features,)) if bias else None

    def forward(self, x, residual=None, activation=None):
        return F.linear(x, self.weight, self.bias, residual, activation)


class Embedding(Module):
    def __init__(self, num_embeddings, dim, std=0.02):
        self.weight = parameter((num_embeddings, dim), std)

    def forward(self, idx):
        return F.embedding(self.weight, idx)


class LayerNorm(Module):
    def __init__(self, dim, bias=True, eps=1e-5):
        self.weight = parameter((dim,), fill=1.0)
        self.bias = parameter((dim,)) if bias else None
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class Dropout(Module):
    def __init__(self, p=0.0):
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)
