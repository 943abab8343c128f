"""Differentiable operations, `tinynn.functional` (F): the fused neural-network ops (linear layers, the MLP,
softmax, attention, LayerNorm, embeddings, cross entropy, the classifier, dropout), each one node of the
graph, and the tensor algebra they build on (tensor_ops.py), re-exported so that F holds every op.

Every function takes and returns `Tensor`s; the arithmetic is the backend's (numpy_backend.py holds the
reference formulas), so these functions only wire values and gradients.
"""
from __future__ import annotations

import math

import numpy as np

from tinynn import rng
from tinynn.tensor import Tensor
from tinynn.tensor_ops import (  # noqa: F401  (re-exported: F.add and the rest)
    _recorded, _result, add, broadcast_to, concatenate, div, exp, gelu, getitem, log, matmul, max, mean,
    mul, neg, permute, pow, relu, reshape, split, sub, sum, tanh, transpose)


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
    """The gradients the forward made, of the loss itself, scaled by the loss's gradient g (a scalar array), or as
    they are where g is None: backward()'s own seed of one, which would cost a multiply a gradient."""
    def backward(g):
        grads = (g_x, g_w) + ((g_b,) if g_b is not None else ())
        if g is not None:
            grads = tuple(be.binary("mul", a, g) for a in grads)
        return (be.reshape(grads[0], x_shape),) + grads[1:]
    backward.accepts_unit_seed = True  # (tensor.py)
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
