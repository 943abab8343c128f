"""Differentiable operations: each a forward through the backend and the closure that gives its gradient.

Every function takes and returns `Tensor`s; the arithmetic is the backend's (numpy_backend.py holds the
reference formulas), so these functions only wire values and gradients. Broadcasting follows NumPy; the
gradient of a broadcast input is summed back to its shape (`_unbroadcast`).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from tinynn import rng
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


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, residual: Tensor | None = None,
           activation: str | None = None) -> Tensor:
    """activation(x @ weight.T + bias) + residual, weight shaped (out_features, in_features) as in PyTorch.
    Bias, activation ("gelu") and residual are each optional and fused into the matmul (one kernel on the
    GPU): a transformer's MLP input layer is linear(x, w, b, activation="gelu"), its output layers add the
    residual stream with linear(h, w, b, residual=x). One node of the graph, on x of any leading axes (no
    reshapes): an eager forward pays for every array and Tensor it makes."""
    be, parents = x.backend, (x, weight, bias, residual)
    _check_linear("linear", x.shape, weight, bias, residual)
    recorded = _recorded(parents)
    y, pre = be.linear_forward(x.data, weight.data, None if bias is None else bias.data,
                               None if residual is None else residual.data, activation, recorded)  # (..., out)
    if not recorded:  # an eager forward: no node, and no backward closure made (see _linear_backward)
        return Tensor(y, be)
    return _result(y, be, parents, _linear_backward(be, x, weight, bias, residual, pre, activation))


def _linear_backward(be, x, weight, bias, residual, pre, activation):
    """linear's backward, made only for a recorded node: Python makes a closure's cells when the function that
    holds it starts, so an eager forward, which needs no backward, would pay for them too."""
    def backward(g):  # g: the output's shape (..., out)
        g_x, g_w, g_b = be.linear_backward(_rows(be, g), _rows(be, x.data), weight.data,
                                           None if pre is None else _rows(be, pre), activation,
                                           has_bias=bias is not None)
        return (be.reshape(g_x, x.shape), g_w) + ((g_b,) if bias is not None else ()) + _residual_grad(g, residual)
    return backward


def mlp(x: Tensor, fc_weight: Tensor, fc_bias: Tensor | None, proj_weight: Tensor, proj_bias: Tensor | None,
        residual: Tensor | None = None) -> Tensor:
    """A transformer's MLP, proj(gelu(fc(x))) + residual, as one node: two fused linear layers whose
    backward applies GELU's gradient in the store of the matmul that computes its output's gradient (no
    pass of its own). Weights (out_features, in_features); biases and residual optional."""
    be = x.backend
    hidden = _check_linear("mlp", x.shape, fc_weight, fc_bias, None)
    _check_linear("mlp", x.shape[:-1] + (hidden,), proj_weight, proj_bias, residual)
    parents = (x, fc_weight, fc_bias, proj_weight, proj_bias, residual)
    recorded = _recorded(parents)
    h, pre = be.linear_forward(x.data, fc_weight.data, None if fc_bias is None else fc_bias.data, None, "gelu",
                               recorded)  # (..., hidden)
    y, _ = be.linear_forward(h, proj_weight.data, None if proj_bias is None else proj_bias.data,
                             None if residual is None else residual.data, None)  # (..., out)
    if not recorded:  # no backward closure made (see _linear_backward)
        return Tensor(y, be)
    return _result(y, be, parents, _mlp_backward(be, x, h, pre, fc_weight, fc_bias, proj_weight, proj_bias, residual))


def _mlp_backward(be, x, h, pre, fc_weight, fc_bias, proj_weight, proj_bias, residual):
    def backward(g):  # g: the output's shape (..., out)
        g_pre, g_w2, g_b2 = be.linear_backward(_rows(be, g), _rows(be, h), proj_weight.data,
                                               has_bias=proj_bias is not None, x_activation="gelu",
                                               x_pre=_rows(be, pre))
        g_x, g_w1, g_b1 = be.linear_backward(g_pre, _rows(be, x.data), fc_weight.data, has_bias=fc_bias is not None)
        return tuple(v for v in (be.reshape(g_x, x.shape), g_w1, g_b1, g_w2, g_b2) if v is not None) + \
            _residual_grad(g, residual)
    return backward


def _rows(be, a):
    """A linear layer's array (..., n) as rows (N, n), for its backward (`Backend.linear_backward`)."""
    return be.reshape(a, (math.prod(a.shape[:-1]), a.shape[-1]))  # (N, n)


def _check_linear(name, x_shape, weight, bias, residual) -> int:
    """Refuse operands that do not fit x_shape @ weight.T + bias (+ residual); -> out_features."""
    w_shape = weight.shape
    out_features = w_shape[0]
    if len(x_shape) < 1 or len(w_shape) != 2 or x_shape[-1] != w_shape[1]:
        raise ValueError(f"{name}: x {x_shape} and weight {w_shape} do not fit")
    if bias is not None and bias.shape != (out_features,):
        raise ValueError(f"{name}: bias {bias.shape} does not fit weight {w_shape}")
    if residual is not None and residual.shape != x_shape[:-1] + (out_features,):
        raise ValueError(f"{name}: residual {residual.shape} is not the output's shape "
                         f"{x_shape[:-1] + (out_features,)}")
    return out_features


def _residual_grad(g, residual) -> tuple:
    """The residual's gradient: g itself, the output's shape. The residual itself is the parent (not a reshape of
    it), so this gradient reaches it as soon as the linear's backward runs: before the backward of a LayerNorm
    that also reads it, which then adds it in its own kernel (layer_norm)."""
    return () if residual is None else (g,)


# --- fused neural-network ops ---

def _along_last(fn, a: Tensor, axis: int) -> Tensor:
    """Apply a last-axis op along any axis by moving that axis to the end and back."""
    axis = axis % a.ndim
    if axis == a.ndim - 1:
        return fn(a)
    order = [i for i in range(a.ndim) if i != axis] + [axis]
    return permute(fn(permute(a, order)), np.argsort(order))


def softmax(a: Tensor, axis=-1, causal=False, scale=1.0) -> Tensor:
    """softmax(scale * a); `causal` masks the future (key j > query i over the last two axes) first.
    Scale and mask are fused into the one kernel (attention's 1/sqrt(head size) costs nothing extra)."""
    def last(x):
        be = x.backend
        y = be.softmax_forward(x.data, causal, scale)
        return _result(y, be, (x,), lambda g: (be.softmax_backward(y, g, scale),))
    if causal and axis % a.ndim != a.ndim - 1:
        raise ValueError("causal softmax runs over the last axis")
    return _along_last(last, a, axis)


def log_softmax(a: Tensor, axis=-1) -> Tensor:
    def last(x):
        be = x.backend
        y = be.log_softmax_forward(x.data)
        return _result(y, be, (x,), lambda g: (be.log_softmax_backward(y, g),))
    return _along_last(last, a, axis)


def causal_mask(a: Tensor, value=float("-inf")) -> Tensor:
    """Fill key positions after each query position (last two axes) with `value`."""
    be = a.backend
    return _result(be.causal_fill(a.data, value), be, (a,), lambda g: (be.causal_fill(g, 0.0),))


def attention(qkv: Tensor, n_head: int) -> Tensor:
    """Causal self-attention of the qkv projection's output (B, T, 3C) = [q | k | v] -> (B, T, C), heads
    side by side as the output projection reads them; scores scaled by 1/sqrt(head size). One fused op:
    the backward recomputes the probabilities from the forward's per-row logsumexp."""
    B, T, C3 = qkv.shape
    if C3 % 3 or (C3 // 3) % n_head:
        raise ValueError(f"attention: the last axis of qkv {qkv.shape} is not 3 * n_head ({n_head}) * head size")
    be, scale, parents = qkv.backend, 1.0 / math.sqrt(C3 // 3 // n_head), (qkv,)
    recorded = _recorded(parents)
    y, lse = be.attention_forward(qkv.data, n_head, scale, recorded)
    if not recorded:  # no backward closure made (see _linear_backward)
        return Tensor(y, be)
    return _result(y, be, parents, _attention_backward(be, qkv, y, lse, n_head, scale))


def _attention_backward(be, qkv, y, lse, n_head, scale):
    return lambda g: (be.attention_backward(g, qkv.data, y, lse, n_head, scale),)


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps=1e-5) -> Tensor:
    """Normalise over the last axis, then scale and shift; statistics and normalisation fused."""
    be, parents = x.backend, (x, weight, bias)
    recorded = _recorded(parents)
    y, mean_, rstd = be.layernorm_forward(x.data, None if weight is None else weight.data,
                                          None if bias is None else bias.data, eps, recorded)
    if not recorded:  # no backward closure made (see _linear_backward)
        return Tensor(y, be)
    return _result(y, be, parents, _layer_norm_backward(be, x, weight, bias, mean_, rstd))


def _layer_norm_backward(be, x, weight, bias, mean_, rstd):
    def backward(g, g_x_so_far=None):
        g_x, g_w, g_b = be.layernorm_backward(g, x.data, _data(weight), mean_, rstd, has_bias=bias is not None,
                                              g_add=g_x_so_far)
        return tuple(v for v in (g_x, g_w, g_b) if v is not None)
    backward.adds_first_parent_grad = True  # x's residual-stream gradient is added in the kernel (tensor.py)
    return backward


def embedding(weight: Tensor, idx) -> Tensor:
    """Rows of `weight` (num_embeddings, dim) picked by the integer tensor `idx`; result idx.shape + (dim,)."""
    be = weight.backend
    if not isinstance(idx, Tensor):
        idx = Tensor(be.from_numpy(np.asarray(idx, dtype=np.int64)), be)
    return _result(be.embedding_forward(weight.data, idx.data), be, (weight,),
                   lambda g: (be.embedding_backward(g, idx.data, weight.shape[0]),))


def embedding_with_positions(wte: Tensor, wpe: Tensor, idx) -> Tensor:
    """wte[idx] + wpe[:T], a GPT's input: token rows plus position rows (positions 0..T-1 along idx's last axis)
    in one op, so the sum and its gradients (per id, and per position over the batch) cost a kernel each."""
    be = wte.backend
    if not isinstance(idx, Tensor):
        idx = Tensor(be.from_numpy(np.asarray(idx, dtype=np.int64)), be)
    if idx.ndim < 1 or idx.shape[-1] > wpe.shape[0]:
        raise ValueError(f"embedding_with_positions: ids {idx.shape} need more than the {wpe.shape[0]} positions")
    return _result(be.embedding_with_positions_forward(wte.data, wpe.data, idx.data), be, (wte, wpe),
                   lambda g: be.embedding_with_positions_backward(g, idx.data, wte.shape[0], wpe.shape[0]))


def cross_entropy(logits: Tensor, targets, ignore_index=-100) -> Tensor:
    """Mean cross entropy of integer `targets` (...) under `logits` (..., C); `ignore_index` rows skipped."""
    be = logits.backend
    if not isinstance(targets, Tensor):
        targets = Tensor(be.from_numpy(np.asarray(targets, dtype=np.int64)), be)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"cross_entropy: targets {targets.shape} do not match logits {logits.shape}")
    flat = reshape(logits, (-1, logits.shape[-1]))  # (N, C)
    t = be.reshape(targets.data, (flat.shape[0],))
    loss, probs, count = be.cross_entropy_forward(flat.data, t, ignore_index, _recorded((flat,)))
    return _result(loss, be, (flat,), lambda g: (be.cross_entropy_backward(probs, t, g, ignore_index, count),))


def classifier(x: Tensor, weight: Tensor, bias: Tensor | None, targets, vocab: int | None = None,
               ignore_index=-100) -> Tensor:
    """Mean cross entropy of integer `targets` (...) under the logits x @ weight.T + bias, with x (..., C) and
    weight (V, C) as a linear layer's: cross_entropy(linear(x, weight, bias), targets) with the logits never
    made whole nor kept (`Backend.classifier_forward`, llm.c's fused classifier). Only the first `vocab` columns
    (default: all V) are classes; the others pad the head to a size matmuls like and take no probability."""
    be, parents = x.backend, (x, weight, bias)
    _check_linear("classifier", x.shape, weight, bias, None)
    vocab = weight.shape[0] if vocab is None else vocab
    if not 1 <= vocab <= weight.shape[0]:
        raise ValueError(f"classifier: vocab {vocab} is not in [1, {weight.shape[0]}] (the head's rows)")
    if not isinstance(targets, Tensor):
        targets = Tensor(be.from_numpy(np.asarray(targets, dtype=np.int64)), be)
    if targets.shape != x.shape[:-1]:
        raise ValueError(f"classifier: targets {targets.shape} do not match x {x.shape}")
    recorded = _recorded(parents)
    loss, g_x, g_w, g_b = be.classifier_forward(_rows(be, x.data), weight.data, _data(bias),
                                                be.reshape(targets.data, (math.prod(targets.shape),)), vocab,
                                                ignore_index, recorded)
    if not recorded:
        return Tensor(loss, be)
    return _result(loss, be, parents, _classifier_backward(be, x.shape, g_x, g_w, g_b))


def _classifier_backward(be, x_shape, g_x, g_w, g_b):
    """The gradients the forward made, of the loss itself, scaled by the loss's gradient g (a scalar array)."""
    def backward(g):
        scaled = (be.reshape(be.binary("mul", g_x, g), x_shape), be.binary("mul", g_w, g))
        return scaled + ((be.binary("mul", g_b, g),) if g_b is not None else ())
    return backward


def dropout(x: Tensor, p: float, training=True) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p); identity when not training."""
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    be = x.backend
    keep = be.dropout_mask(x.shape, p, int(rng.generator().integers(2**31)), x.dtype)
    return _result(be.binary("mul", x.data, keep), be, (x,), lambda g: (be.binary("mul", g, keep),))


def _data(t: Tensor | None):
    return None if t is None else t.data
