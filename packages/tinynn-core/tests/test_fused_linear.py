"""The fused linear layer (bias, GELU and residual add in the matmul, the bias gradient beside the weight
gradient) and the MLP of two of them (GELU's gradient in the matmul too): gradients against finite
differences in float64, ops against the reference on every backend, the residual gradient added by the
LayerNorm's backward, and the transformer block that uses them against the same block written op by op."""
import numpy as np
import pytest

import tinynn
from tinynn import backends
from tinynn import functional as F
from tinynn import nn
from tinynn.model import Block
from helpers import gradcheck, relative_error
from test_backend_ops import check, randn

FORMS = [(False, None, False), (True, None, False), (True, "gelu", False), (True, None, True), (False, "gelu", True),
         (True, "gelu", True)]


@pytest.mark.parametrize("has_bias,activation,has_residual", FORMS)
def test_linear_gradients(has_bias, activation, has_residual, rng):
    n_in, n_out = (int(v) for v in rng.integers(1, 5, size=2))
    lead = (2, int(rng.integers(1, 4)))
    arrays = [rng.standard_normal(lead + (n_in,)), rng.standard_normal((n_out, n_in))]
    arrays += [rng.standard_normal(n_out)] if has_bias else []
    arrays += [rng.standard_normal(lead + (n_out,))] if has_residual else []

    def fn(x, w, *rest):
        rest = list(rest)
        bias = rest.pop(0) if has_bias else None
        residual = rest.pop(0) if has_residual else None
        return F.linear(x, w, bias, residual, activation)
    gradcheck(fn, *arrays)


@pytest.mark.parametrize("has_bias,activation,has_residual", FORMS)
def test_linear_ops_match_the_reference(backend, has_bias, activation, has_residual, rng):
    n, n_in, n_out = 37, 70, 19
    x, w, g = randn(rng, n, n_in), randn(rng, n_out, n_in), randn(rng, n, n_out)
    bias = randn(rng, n_out) if has_bias else None
    residual = randn(rng, n, n_out) if has_residual else None
    y, pre = check(backend, "linear_forward", x, w, bias, residual, activation)
    check(backend, "linear_backward", g, x, w, pre, activation, has_bias=has_bias)


@pytest.mark.parametrize("has_bias,has_residual", [(False, False), (True, False), (True, True)])
def test_mlp_gradients(has_bias, has_residual, rng):
    n_in, hidden, n_out = (int(v) for v in rng.integers(1, 5, size=3))
    lead = (2, int(rng.integers(1, 4)))
    arrays = [rng.standard_normal(lead + (n_in,)), rng.standard_normal((hidden, n_in)),
              rng.standard_normal((n_out, hidden))]
    arrays += [rng.standard_normal(hidden), rng.standard_normal(n_out)] if has_bias else []
    arrays += [rng.standard_normal(lead + (n_out,))] if has_residual else []

    def fn(x, w1, w2, *rest):
        b1, b2 = rest[:2] if has_bias else (None, None)
        return F.mlp(x, w1, b1, w2, b2, rest[-1] if has_residual else None)
    gradcheck(fn, *arrays)


@pytest.mark.parametrize("lead", [(2, 3, 5), (4,), ()])
def test_linear_forward_takes_any_leading_axes(backend, lead, rng):
    """x (..., in) -> y and pre (..., out), residual (..., out): no reshape to rows and back (interface 4)."""
    n_in, n_out = 70, 19
    x, w, bias, residual = randn(rng, *lead, n_in), randn(rng, n_out, n_in), randn(rng, n_out), randn(rng, *lead, n_out)
    check(backend, "linear_forward", x, w, bias, residual, "gelu")
    check(backend, "linear_forward", x, w)


def test_linear_backward_through_the_previous_activation(backend, rng):
    """x_activation: g_x is the gradient of the GELU's input, its derivative applied in the same op."""
    n, n_in, n_out = 37, 70, 19
    x_pre, w, g = randn(rng, n, n_in), randn(rng, n_out, n_in), randn(rng, n, n_out)
    x = backends.reference().unary("gelu", x_pre)
    check(backend, "linear_backward", g, x, w, has_bias=True, x_activation="gelu", x_pre=x_pre)


def test_layer_norm_adds_the_residual_gradient_in_its_backward(backend, rng):
    """x feeding a LayerNorm and a residual add (a pre-norm block): the LayerNorm's backward is handed the
    residual's gradient and adds it (no add of its own), and the gradient is right (finite differences)."""
    gradcheck(lambda x, w: F.linear(F.layer_norm(x, None, None), w, residual=x), rng.standard_normal((2, 3, 4)),
              rng.standard_normal((4, 4)))
    ln, proj = nn.LayerNorm(8).to(backend), nn.Linear(8, 8).to(backend)
    x = tinynn.tensor(randn(rng, 2, 3, 8), requires_grad=True, backend=backend)
    y = proj(ln(x), residual=x)
    calls = []
    plain_binary, plain_layernorm = backend.binary, backend.layernorm_backward
    backend.binary = lambda op, a, b: calls.append(op) or plain_binary(op, a, b)
    backend.layernorm_backward = lambda *args, g_add, **kwargs: calls.append(g_add is not None) or \
        plain_layernorm(*args, g_add=g_add, **kwargs)
    try:
        (y * y).sum().backward()
    finally:
        del backend.binary, backend.layernorm_backward
    assert [c for c in calls if c != "mul"] == ["add", True]  # y's two from y * y, then the LayerNorm's g_add


def test_linear_rejects_misfits():
    x, w = tinynn.tensor(np.ones((3, 4))), tinynn.tensor(np.ones((5, 4)))
    with pytest.raises(ValueError, match="residual"):
        F.linear(x, w, residual=tinynn.tensor(np.ones((3, 4))))
    with pytest.raises(ValueError, match="bias"):
        F.linear(x, w, tinynn.tensor(np.ones(4)))
    with pytest.raises(ValueError, match="mlp: residual"):
        F.mlp(x, w, None, tinynn.tensor(np.ones((2, 5))), None, residual=tinynn.tensor(np.ones((3, 3))))
    with pytest.raises(ValueError, match="activation"):
        backends.reference().linear_forward(np.ones((3, 4)), np.ones((5, 4)), activation="swish")


def test_block_equals_the_unfused_block(backend, rng):
    """Block.forward with the fused residual adds and GELU gives the textbook block's values and gradients."""
    tinynn.manual_seed(0)
    block = Block(16, 2, 1).to(backend)
    x_np = randn(rng, 2, 5, 16)

    def unfused(x):
        h = block.ln1(x)
        a = block.attn
        B, T, C = h.shape
        qkv = a.qkv(h).reshape(B, T, 3, a.n_head, C // a.n_head).permute(2, 0, 3, 1, 4)
        att = F.softmax(F.matmul(qkv[0], qkv[1], transpose_b=True), causal=True, scale=(C // a.n_head) ** -0.5)
        x = x + a.proj((att @ qkv[2]).permute(0, 2, 1, 3).reshape(B, T, C))
        m = block.mlp
        return x + m.proj(F.gelu(m.fc(block.ln2(x))))

    results = []
    for forward in (block.forward, unfused):
        block.zero_grad()
        x = tinynn.tensor(x_np, requires_grad=True, backend=backend)
        y = forward(x)
        (y * y).sum().backward()
        results.append([y.numpy(), x.grad.numpy()] + [p.grad.numpy() for p in block.parameters()])
    for fused, plain in zip(*results):
        assert relative_error(fused, plain) <= 1e-5
