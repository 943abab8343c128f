"""Every differentiable op's gradient against central finite differences, in float64, on the NumPy
reference; shapes are drawn per test and include broadcasting and size-1 dims."""
import numpy as np
import pytest

import tinynn
from tinynn import backends
from tinynn import functional as F
from helpers import assert_close, gradcheck


def shape(rng, ndim, low=1, high=4):
    return tuple(int(n) for n in rng.integers(low, high + 1, size=ndim))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_broadcasting(op, rng):
    full = shape(rng, 3)
    small = tuple(1 if rng.random() < 0.5 else n for n in full[1:])  # broadcast over the first dim and some 1s
    a, b = rng.standard_normal(full), rng.standard_normal(small)
    if op == "div":
        b = np.sign(b) * (np.abs(b) + 0.5)
    fn = {"add": F.add, "sub": F.sub, "mul": F.mul, "div": F.div}[op]
    gradcheck(fn, a, b)
    gradcheck(lambda x, y: fn(y, x), a, b)


@pytest.mark.parametrize("scalar_op", ["radd", "rsub", "rmul", "rdiv", "pow"])
def test_scalar_ops(scalar_op, rng):
    a = rng.random(shape(rng, 2)) + 0.5
    fn = {"radd": lambda x: 2.5 + x, "rsub": lambda x: 2.5 - x, "rmul": lambda x: 2.5 * x,
          "rdiv": lambda x: 2.5 / x, "pow": lambda x: x ** 1.7}[scalar_op]
    gradcheck(fn, a)


@pytest.mark.parametrize("op", ["neg", "exp", "log", "tanh", "relu", "gelu"])
def test_unary(op, rng):
    a = rng.standard_normal(shape(rng, 3))
    if op == "log":
        a = np.abs(a) + 0.1
    if op == "relu":
        a = np.where(np.abs(a) < 1e-3, 0.5, a)  # keep away from the kink
    gradcheck(getattr(F, op), a)


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (-1, True), ((0, 2), False), ((1,), True)])
def test_reductions(axis, keepdims, rng):
    a = rng.standard_normal(shape(rng, 3, 2, 4))
    gradcheck(lambda x: F.sum(x, axis, keepdims), a)
    gradcheck(lambda x: F.mean(x, axis, keepdims), a)
    gradcheck(lambda x: F.max(x, axis, keepdims), a)


def test_max_splits_gradient_between_ties():
    x = tinynn.tensor(np.array([[1.0, 3.0, 3.0]]), requires_grad=True, backend="cpu")
    F.max(x, axis=1).sum().backward()
    assert_close(x.grad.numpy(), [[0.0, 0.5, 0.5]], rtol=0)


def test_layout_ops(rng):
    a = rng.standard_normal((2, 3, 4))
    gradcheck(lambda x: F.reshape(x, (4, -1)), a)
    gradcheck(lambda x: F.permute(x, (2, 0, 1)), a)
    gradcheck(lambda x: F.transpose(x, 0, 2), a)
    gradcheck(lambda x: x[1:, ::2, 1], a)
    gradcheck(lambda x: x[np.array([0, 1, 0])], a)  # a repeated index accumulates
    gradcheck(lambda x: F.broadcast_to(x[:, :1], (5, 2, 1, 4)), a)


def test_concatenate_and_split(rng):
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 5))
    gradcheck(lambda x, y: F.concatenate([x, y], axis=1), a, b)
    gradcheck(lambda x: F.concatenate(F.split(x, 2, axis=1)[::-1], axis=1), b)
    assert [p.shape for p in F.split(tinynn.tensor(b), 2, axis=1)] == [(2, 2), (2, 2), (2, 1)]


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_forms(ta, tb, rng):
    batch, m, k, n = 2, *shape(rng, 3, 1, 5)
    a = rng.standard_normal((batch, k, m) if ta else (batch, m, k))
    b = rng.standard_normal((batch, n, k) if tb else (batch, k, n))
    gradcheck(lambda x, y: F.matmul(x, y, ta, tb), a, b)


def test_matmul_broadcasts_batch_dims(rng):
    gradcheck(F.matmul, rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((5, 4, 2)))
    gradcheck(F.matmul, rng.standard_normal((3, 2, 4)), rng.standard_normal((4, 3)))  # a shared weight
    gradcheck(lambda x, w: F.linear(x, w), rng.standard_normal((2, 3, 4)), rng.standard_normal((5, 4)))
    gradcheck(F.linear, rng.standard_normal((2, 3, 4)), rng.standard_normal((5, 4)), rng.standard_normal(5))
    gradcheck(F.linear, rng.standard_normal(4), rng.standard_normal((5, 4)), rng.standard_normal(5))


def test_softmax_family(rng):
    a = rng.standard_normal((2, 3, 5))
    gradcheck(lambda x: F.softmax(x, -1), a)
    gradcheck(lambda x: F.softmax(x, 1), a)
    gradcheck(lambda x: F.log_softmax(x, -1), a)
    gradcheck(lambda x: F.log_softmax(x, 0), a)
    sq = rng.standard_normal((2, 4, 4))
    gradcheck(lambda x: F.softmax(x, causal=True), sq)
    gradcheck(lambda x: F.softmax(x, causal=True, scale=0.3), sq)
    gradcheck(lambda x: F.softmax(F.causal_mask(x), -1), sq)


def test_causal_softmax_ignores_the_future(rng):
    x = rng.standard_normal((3, 3))
    y = F.softmax(tinynn.tensor(x, backend="cpu"), causal=True).numpy()
    assert_close(np.triu(y, 1), np.zeros((3, 3)), rtol=0)
    assert_close(y[1, :2], np.exp(x[1, :2]) / np.exp(x[1, :2]).sum(), rtol=1e-12)


def _unfused_attention(qkv, n_head):
    """Causal self-attention composed of separate ops: what the fused op must equal."""
    B, T, C3 = qkv.shape
    hs = C3 // 3 // n_head
    q, k, v = qkv.reshape(B, T, 3, n_head, hs).permute(2, 0, 3, 1, 4)  # each (B, nh, T, hs)
    att = F.softmax(F.matmul(q, k, transpose_b=True), causal=True, scale=hs ** -0.5)  # (B, nh, T, T)
    return (att @ v).permute(0, 2, 1, 3).reshape(B, T, C3 // 3)


@pytest.mark.parametrize("t", [1, "drawn"])
def test_attention(t, rng):
    B, n_head, hs = shape(rng, 3, 1, 3)
    T = 1 if t == 1 else int(rng.integers(2, 6))
    qkv = rng.standard_normal((B, T, 3 * n_head * hs))
    gradcheck(lambda x: F.attention(x, n_head), qkv)
    fused = F.attention(tinynn.tensor(qkv, backend="cpu"), n_head).numpy()
    unfused = _unfused_attention(tinynn.tensor(qkv, backend="cpu"), n_head).numpy()
    assert_close(fused, unfused, rtol=1e-12, atol=1e-12)
    y, lse = backends.reference().attention_forward(qkv, n_head, hs ** -0.5)
    q, k = qkv[..., :n_head * hs], qkv[..., n_head * hs:2 * n_head * hs]
    scores = np.einsum("bihd,bjhd->bhij", q.reshape(B, T, n_head, hs), k.reshape(B, T, n_head, hs)) * hs ** -0.5
    expected = np.log(np.where(np.tril(np.ones((T, T))), np.exp(scores), 0.0).sum(axis=-1))  # (B, nh, T)
    assert_close(lse, expected, rtol=1e-12, atol=1e-12, what="lse")


@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm(affine, rng):
    x = rng.standard_normal((2, 3, 6))
    w, b = rng.standard_normal(6), rng.standard_normal(6)
    if affine == "both":
        gradcheck(lambda x, w, b: F.layer_norm(x, w, b), x, w, b)
    elif affine == "weight":
        gradcheck(lambda x, w: F.layer_norm(x, w, None), x, w)
    else:
        gradcheck(lambda x: F.layer_norm(x, None, None), x)
    y = F.layer_norm(tinynn.tensor(x, backend="cpu"), None, None).numpy()
    assert_close(y.mean(-1), np.zeros((2, 3)), rtol=0, atol=1e-12)


def test_embedding_accumulates_repeated_rows(rng):
    idx = np.array([[0, 2, 2], [1, 2, 0]])
    gradcheck(lambda w: F.embedding(w, idx), rng.standard_normal((4, 3)))


@pytest.mark.parametrize("ignore", [False, True])
def test_cross_entropy(ignore, rng):
    logits = rng.standard_normal((2, 3, 5))
    targets = rng.integers(0, 5, (2, 3))
    if ignore:
        targets[0, 1] = targets[1, 2] = -100
    gradcheck(lambda x: F.cross_entropy(x, targets), logits)
    valid = targets.reshape(-1) != -100
    logp = logits.reshape(-1, 5) - np.log(np.exp(logits.reshape(-1, 5)).sum(-1, keepdims=True))
    expected = -logp[np.arange(6)[valid], targets.reshape(-1)[valid]].mean()
    assert_close(F.cross_entropy(tinynn.tensor(logits, backend="cpu"), targets).item(), expected, rtol=1e-12)


def test_dropout(rng):
    x = tinynn.tensor(np.ones((200, 50)), requires_grad=True, backend="cpu")
    y = F.dropout(x, 0.3, training=True)
    kept = y.numpy() != 0
    assert 0.65 < kept.mean() < 0.75
    assert_close(y.numpy()[kept], np.full(kept.sum(), 1 / 0.7), rtol=1e-12)
    y.sum().backward()
    assert_close(x.grad.numpy(), y.numpy(), rtol=0)  # the gradient flows through the same mask
    assert F.dropout(x, 0.3, training=False) is x


def test_graph_reuse_and_accumulation(rng):
    a = tinynn.tensor(rng.standard_normal(3), requires_grad=True, backend="cpu")
    b = a * a + a  # a used three times
    b.sum().backward()
    expected = 2 * a.numpy() + 1
    assert_close(a.grad.numpy(), expected, rtol=1e-12)
    b.sum().backward()  # gradients accumulate until zeroed
    assert_close(a.grad.numpy(), 2 * expected, rtol=1e-12)


def test_deep_graph_needs_no_recursion():
    x = tinynn.tensor(np.ones(2), requires_grad=True, backend="cpu")
    y = x
    for _ in range(5000):
        y = y * 1.0
    y.sum().backward()
    assert_close(x.grad.numpy(), np.ones(2), rtol=0)


def test_no_grad_and_detach():
    x = tinynn.tensor([1.0, 2.0], requires_grad=True, backend="cpu")
    with tinynn.no_grad():
        assert not (x * 2).requires_grad
    assert not x.detach().requires_grad
    with pytest.raises(RuntimeError, match="scalar"):
        (x * 2).backward()
    assert (x * 2).sum().item() == 6.0


def test_float32_is_the_default_dtype():
    assert tinynn.tensor([1.0, 2.0], backend="cpu").dtype == np.float32
    assert tinynn.tensor(np.zeros(2), backend="cpu").dtype == np.float64  # an explicit array keeps its dtype
    assert backends.reference().name == "cpu"
