"""Modules: parameters with a forward pass. A Module finds its parameters and submodules in its attributes
(tensors that require grad, modules, lists of modules), in the order they were assigned."""
from __future__ import annotations

import math

import numpy as np

from tinynn import backends, rng
from tinynn import functional as F
from tinynn.errors import TinynnError
from tinynn.tensor import Tensor


def parameter(array: np.ndarray, backend=None) -> Tensor:
    backend = backend or backends.default()
    return Tensor(backend.from_numpy(array.astype(np.float32)), backend, requires_grad=True)


def normal(shape, std) -> np.ndarray:
    return rng.generator().normal(0.0, std, size=shape)


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

    def named_parameters(self, prefix=""):
        for name, value in self._children():
            if isinstance(value, Tensor):
                if value.requires_grad:
                    yield prefix + name, value
            else:
                yield from value.named_parameters(prefix + name + ".")

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
        backend = backends.select(backend) if isinstance(backend, str) else backend
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
    def __init__(self, in_features, out_features, bias=True, std=0.02):
        self.weight = parameter(normal((out_features, in_features), std))
        self.bias = parameter(np.zeros(out_features)) if bias else None

    def forward(self, x, residual=None, activation=None):
        return F.linear(x, self.weight, self.bias, residual, activation)


class Embedding(Module):
    def __init__(self, num_embeddings, dim, std=0.02):
        self.weight = parameter(normal((num_embeddings, dim), std))

    def forward(self, idx):
        return F.embedding(self.weight, idx)


class LayerNorm(Module):
    def __init__(self, dim, bias=True, eps=1e-5):
        self.weight = parameter(np.ones(dim))
        self.bias = parameter(np.zeros(dim)) if bias else None
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class Dropout(Module):
    def __init__(self, p=0.0):
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)


class CausalSelfAttention(Module):
    def __init__(self, n_embd, n_head, n_layer, dropout=0.0, bias=True):
        if n_embd % n_head:
            raise TinynnError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.n_head = n_head
        self.qkv = Linear(n_embd, 3 * n_embd, bias)
        self.proj = Linear(n_embd, n_embd, bias, std=0.02 / math.sqrt(2 * n_layer))  # GPT-2's residual scaling
        self.attn_dropout = Dropout(dropout)
        self.resid_dropout = Dropout(dropout)

    def forward(self, x, residual=None):
        qkv = self.qkv(x)  # (B, T, 3C)
        if self.training and self.attn_dropout.p > 0:
            y = self._attention_with_dropout(qkv)
        else:
            y = F.attention(qkv, self.n_head)  # (B, T, C)
        return _project(self.proj, y, self.resid_dropout, residual)

    def _attention_with_dropout(self, qkv):
        """The unfused path: the dropout mask applies to the T x T probabilities, which the fused op never
        materialises (on the GPU the step then runs eagerly: dropout draws a new mask every step)."""
        B, T, C3 = qkv.shape
        hs = C3 // 3 // self.n_head
        qkv = qkv.reshape(B, T, 3, self.n_head, hs).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        q, k, v = qkv[0], qkv[1], qkv[2]  # each (B, nh, T, hs)
        att = F.matmul(q, k, transpose_b=True)  # (B, nh, T, T)
        att = self.attn_dropout(F.softmax(att, causal=True, scale=1.0 / math.sqrt(hs)))
        return (att @ v).permute(0, 2, 1, 3).reshape(B, T, C3 // 3)  # (B, nh, T, hs) -> (B, T, C)

    def decode(self, x, cache, residual=None):
        """x (B, 1, C), one new position: its keys and values join the cache (a generate.LayerCache), its
        query attends over every cached position; `residual` is added in the projection, as in forward."""
        qkv = self.qkv(x)  # (B, 1, 3C)
        cache.write(qkv)
        return self.proj(cache.attend(qkv, self.n_head), residual=residual)


class MLP(Module):
    def __init__(self, n_embd, n_layer, dropout=0.0, bias=True):
        self.fc = Linear(n_embd, 4 * n_embd, bias)
        self.proj = Linear(4 * n_embd, n_embd, bias, std=0.02 / math.sqrt(2 * n_layer))
        self.dropout = Dropout(dropout)

    def forward(self, x, residual=None):
        """proj(gelu(fc(x))) + residual as one fused op (F.mlp), unless a dropout comes before the add."""
        if self.dropout.training and self.dropout.p > 0:
            y = self.dropout(F.mlp(x, self.fc.weight, self.fc.bias, self.proj.weight, self.proj.bias))
            return y if residual is None else residual + y
        return F.mlp(x, self.fc.weight, self.fc.bias, self.proj.weight, self.proj.bias, residual)


class Block(Module):
    """A pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd, n_head, n_layer, dropout=0.0, bias=True):
        self.ln1 = LayerNorm(n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, n_layer, dropout, bias)
        self.ln2 = LayerNorm(n_embd, bias)
        self.mlp = MLP(n_embd, n_layer, dropout, bias)

    def forward(self, x):
        x = self.attn(self.ln1(x), residual=x)  # x + attn(ln1(x)), the add fused into attn's projection
        return self.mlp(self.ln2(x), residual=x)

    def prefill(self, x, cache):
        """forward, with every position's keys and values kept in the cache for the tokens that follow
        (the projection runs a second time here: once per prompt, so forward stays the one training path)."""
        cache.write(self.attn.qkv(self.ln1(x)))
        return self(x)

    def decode(self, x, cache):
        """forward for one new position x (B, 1, C), attending over the cached ones."""
        x = self.attn.decode(self.ln1(x), cache, residual=x)
        return self.mlp(self.ln2(x), residual=x)


def _project(proj: Linear, x, dropout: Dropout, residual):
    """dropout(proj(x)) + residual, the add fused into proj's matmul unless a dropout comes between."""
    if residual is None:
        return dropout(proj(x))
    if dropout.training and dropout.p > 0:
        return residual + dropout(proj(x))
    return proj(x, residual=residual)
