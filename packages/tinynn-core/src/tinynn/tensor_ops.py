"""The differentiable tensor algebra: elementwise arithmetic, reductions, shape and layout, and matmul, each a
forward through the backend and the closure that gives its gradient; and the helpers that make an op's output
a node of the graph. `tinynn.functional` re-exports every op here beside the fused neural-network ops.

Every function takes and returns `Tensor`s; the arithmetic is the backend's (numpy_backend.py holds the
reference formulas), so these functions only wire values and gradients. Broadcasting follows NumPy; the
gradient of a broadcast input is summed back to its shape (`_unbroadcast`).
"""
from __future__ import annotations

import numbers

import numpy as np

from tinynn import tensor as _tensor
from tinynn.tensor import Tensor


def _result(data, backend, parents, backward) -> Tensor:
    """The op's output; a node of the graph when `_recorded(parents)`. `parents` may hold None for an absent
    optional input (a bias): dropped here, only when the node is recorded (an eager forward under no_grad
    builds no tuple)."""
    if _recorded(parents):
        return Tensor(data, backend, requires_grad=True, _parents=tuple(p for p in parents if p is not None),
                      _backward=backward)
    return Tensor(data, backend)


def _recorded(parents) -> bool:
    """Whether an op on these inputs becomes a node of the graph (grad on and an input requires it): an op
    whose backward reads outputs of its forward asks for them (`for_backward`) only then."""
    return _tensor._grad_enabled and any(p is not None and p.requires_grad for p in parents)


def _tensor_like(x, like: Tensor) -> Tensor:
    if isinstance(x, Tensor):
        if x.backend is not like.backend:
            raise ValueError(f"tensors on different backends: {like.backend.name} and {x.backend.name}")
        return x
    return Tensor(like.backend.from_numpy(np.asarray(x, dtype=like.dtype)), like.backend)


def _number(x):
    """A Python number for a scalar op; an integer stays one, so an int tensor plus 1 stays int (NumPy's rule)."""
    return int(x) if isinstance(x, numbers.Integral) else float(x)


def _unbroadcast(backend, g, shape):
    """Sum a gradient of a broadcast result back to the input's `shape`."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = len(g.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return backend.reshape(backend.sum(g, axes), shape)


def _axes(axis, ndim) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    return tuple(sorted(a % ndim for a in axes))


# --- elementwise arithmetic ---

def add(a: Tensor, b) -> Tensor:
    be = a.backend
    if isinstance(b, numbers.Number):
        return _result(be.scalar("add", a.data, _number(b)), be, (a,), lambda g: (g,))
    b = _tensor_like(b, a)
    return _result(be.binary("add", a.data, b.data), be, (a, b),
                   lambda g: (_unbroadcast(be, g, a.shape), _unbroadcast(be, g, b.shape)))


def sub(a: Tensor, b) -> Tensor:
    if isinstance(b, numbers.Number):
        return add(a, -b)
    be, b = a.backend, _tensor_like(b, a)
    return _result(be.binary("sub", a.data, b.data), be, (a, b),
                   lambda g: (_unbroadcast(be, g, a.shape), _unbroadcast(be, be.unary("neg", g), b.shape)))


def mul(a: Tensor, b) -> Tensor:
    be = a.backend
    if isinstance(b, numbers.Number):
        s = _number(b)
        return _result(be.scalar("mul", a.data, s), be, (a,), lambda g: (be.scalar("mul", g, s),))
    b = _tensor_like(b, a)
    return _result(be.binary("mul", a.data, b.data), be, (a, b),
                   lambda g: (_unbroadcast(be, be.binary("mul", g, b.data), a.shape),
                              _unbroadcast(be, be.binary("mul", g, a.data), b.shape)))


def div(a: Tensor, b) -> Tensor:
    if isinstance(b, numbers.Number):
        return mul(a, 1.0 / b)
    be, b = a.backend, _tensor_like(b, a)
    out = be.binary("div", a.data, b.data)

    def backward(g):
        g_a = be.binary("div", g, b.data)
        g_b = be.unary("neg", be.binary("div", be.binary("mul", g, out), b.data))  # -g * a / b^2
        return _unbroadcast(be, g_a, a.shape), _unbroadcast(be, g_b, b.shape)
    return _result(out, be, (a, b), backward)


def pow(a: Tensor, exponent: float) -> Tensor:
    if not isinstance(exponent, numbers.Number):
        raise TypeError(f"pow takes a number as exponent, got {type(exponent).__name__}")
    be, p = a.backend, _number(exponent)
    return _result(be.scalar("pow", a.data, p), be, (a,),
                   lambda g: (be.binary("mul", g, be.scalar("mul", be.scalar("pow", a.data, p - 1.0), p)),))


def _unary(op: str, a: Tensor) -> Tensor:
    be = a.backend
    out = be.unary(op, a.data)
    return _result(out, be, (a,), lambda g: (be.unary_backward(op, a.data, out, g),))


def neg(a): return _unary("neg", a)
def exp(a): return _unary("exp", a)
def log(a): return _unary("log", a)
def tanh(a): return _unary("tanh", a)
def relu(a): return _unary("relu", a)
def gelu(a):
    """GELU, tanh approximation (as in GPT-2)."""
    return _unary("gelu", a)


# --- reductions ---

def sum(a: Tensor, axis=None, keepdims=False) -> Tensor:
    be, axes = a.backend, _axes(axis, a.ndim)
    kept_shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape))
    return _result(be.sum(a.data, axes, keepdims), be, (a,),
                   lambda g: (be.broadcast_to(be.reshape(g, kept_shape), a.shape),))


def mean(a: Tensor, axis=None, keepdims=False) -> Tensor:
    count = int(np.prod([a.shape[i] for i in _axes(axis, a.ndim)]))
    return mul(sum(a, axis, keepdims), 1.0 / count)


def max(a: Tensor, axis=None, keepdims=False) -> Tensor:
    be, axes = a.backend, _axes(axis, a.ndim)
    kept = be.max(a.data, axes, keepdims=True)

    def backward(g):  # ties share the gradient equally
        is_max = be.binary("eq", a.data, kept)
        share = be.binary("div", is_max, be.sum(is_max, axes, keepdims=True))
        return (be.binary("mul", share, be.reshape(g, kept.shape)),)
    out = kept if keepdims else be.reshape(kept, tuple(n for i, n in enumerate(a.shape) if i not in axes))
    return _result(out, be, (a,), backward)


# --- shape and layout ---

def reshape(a: Tensor, shape) -> Tensor:
    shape = tuple(np.empty(a.shape, dtype=np.bool_).reshape(shape).shape)  # resolves -1, checks the size
    return _reshaped(a, shape)


def _reshaped(a: Tensor, shape: tuple) -> Tensor:
    """a as `shape`, a tuple of ints of a's size: reshape once the shape is checked, and the output of a
    linear layer, whose shape needs no check (NumPy's check costs as much as the rest)."""
    be = a.backend
    return _result(be.reshape(a.data, shape), be, (a,), lambda g: (be.reshape(g, a.shape),))


def permute(a: Tensor, axes) -> Tensor:
    be, axes = a.backend, tuple(ax % a.ndim for ax in axes)
    inverse = tuple(np.argsort(axes))
    return _result(be.permute(a.data, axes), be, (a,), lambda g: (be.permute(g, inverse),))


def transpose(a: Tensor, dim0=-2, dim1=-1) -> Tensor:
    axes = list(range(a.ndim))
    axes[dim0], axes[dim1] = axes[dim1], axes[dim0]
    return permute(a, axes)


def broadcast_to(a: Tensor, shape) -> Tensor:
    be, shape = a.backend, tuple(shape)
    if a.shape == shape:
        return a
    return _result(be.broadcast_to(a.data, shape), be, (a,), lambda g: (_unbroadcast(be, g, a.shape),))


def getitem(a: Tensor, index) -> Tensor:
    be = a.backend
    if isinstance(index, Tensor):
        index = index.numpy()
    elif isinstance(index, tuple):
        index = tuple(i.numpy() if isinstance(i, Tensor) else i for i in index)
    return _result(be.getitem(a.data, index), be, (a,), lambda g: (be.getitem_backward(g, index, a.shape),))


def concatenate(tensors, axis=0) -> Tensor:
    tensors = list(tensors)
    be = tensors[0].backend
    axis = axis % tensors[0].ndim
    bounds = np.cumsum([0] + [t.shape[axis] for t in tensors])

    def backward(g):
        lead = (slice(None),) * axis
        return tuple(be.getitem(g, lead + (slice(int(lo), int(hi)),)) for lo, hi in zip(bounds[:-1], bounds[1:]))
    return _result(be.concatenate([t.data for t in tensors], axis), be, tensors, backward)


def split(a: Tensor, size: int, axis=-1) -> list[Tensor]:
    """Consecutive pieces of `size` along `axis` (the last piece may be shorter)."""
    axis = axis % a.ndim
    lead = (slice(None),) * axis
    return [getitem(a, lead + (slice(lo, lo + size),)) for lo in range(0, a.shape[axis], size)]


# --- matmul ---

def matmul(a: Tensor, b: Tensor, transpose_a=False, transpose_b=False) -> Tensor:
    """Batched `op(a) @ op(b)`, op a transpose of the last two axes where asked; batch axes broadcast."""
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul needs operands with at least 2 dims, got {a.shape} and {b.shape}")
    if b.ndim == 2 and a.ndim > 2 and not transpose_a:  # one weight for every row: fold the batch into M
        out = matmul(reshape(a, (-1, a.shape[-1])), b, False, transpose_b)  # (batch*M, N)
        return _reshaped(out, a.shape[:-1] + (out.shape[-1],))
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a, b = broadcast_to(a, batch + a.shape[-2:]), broadcast_to(b, batch + b.shape[-2:])
    k_a = a.shape[-2] if transpose_a else a.shape[-1]
    k_b = b.shape[-1] if transpose_b else b.shape[-2]
    if k_a != k_b:
        raise ValueError(f"matmul: inner dimensions differ ({a.shape}, {b.shape}, "
                         f"transpose_a={transpose_a}, transpose_b={transpose_b})")
    be = a.backend

    def backward(g):
        g_a = be.matmul(b.data, g, transpose_b, True) if transpose_a else be.matmul(g, b.data, False, not transpose_b)
        g_b = be.matmul(g, a.data, True, transpose_a) if transpose_b else be.matmul(a.data, g, not transpose_a, False)
        return g_a, g_b
    return _result(be.matmul(a.data, b.data, transpose_a, transpose_b), be, (a, b), backward)
