"""The textbook formulas the NumPy backend runs (numpy_backend.py): GELU, softmax, LayerNorm and attention's
helpers, each on whole arrays or on one block of rows at a time, giving the same bits either way."""
from __future__ import annotations

import math

import numpy as np

from tinynn import blas
from tinynn.blas import SMALL_PRODUCT
from tinynn.errors import TinynnError

GELU_C = math.sqrt(2.0 / math.pi)


SCORES_BLOCK = 1 << 16  # attention's scores in a block of queries, every head's (query_rows): 256 KiB of float32
GELU_EDGE = 12.0  # beyond +-12, 2 x s (1 - s) u' in GELU's gradient is 0 in float32


def gelu_sigmoid(x):
    """GELU (tanh form, GPT-2's) is 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = GELU_C (x + 0.044715 x^3): this
    sigmoid. It does not cancel: 1 + tanh(u) rounds to 0 in float32 for x < -5.4, where GELU(x) is still ~1e-8 x.
    exp overflows to inf for x < -10 and the sigmoid is then 0, GELU's limit (NumPy's floats are IEEE; the GPU's
    common.wgsl, which may not assume infinities, computes it from exp(-|2u|) instead)."""
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-2 * GELU_C * (x + 0.044715 * x * x * x)))  # x*x*x: float power is ~20x slower


def gelu(x, out=None):
    """GELU, into `out` where given (x itself: in place)."""
    return np.multiply(x, gelu_sigmoid(x), out=out)


def gelu_grad(x, g):
    """GELU's gradient: s + 2 x s (1 - s) u', x clamped where s (1 - s) is 0: finite for every finite x."""
    s, c = gelu_sigmoid(x), np.clip(x, -GELU_EDGE, GELU_EDGE)
    return g * (s + 2 * c * s * (1 - s) * GELU_C * (1 + 3 * 0.044715 * c * c))


UNARY = {"neg": np.negative, "exp": np.exp, "log": np.log, "tanh": np.tanh,
         "relu": lambda a: np.maximum(a, 0).astype(a.dtype), "gelu": lambda a: gelu(a).astype(a.dtype)}
UNARY_BACKWARD = {"neg": lambda x, y, g: -g, "exp": lambda x, y, g: g * y, "log": lambda x, y, g: g / x,
                  "tanh": lambda x, y, g: g * (1.0 - y * y),
                  "relu": lambda x, y, g: g * (x > 0).astype(g.dtype),
                  "gelu": lambda x, y, g: gelu_grad(x, g).astype(g.dtype)}
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
          "eq": lambda a, b: (a == b).astype(np.result_type(a, b))}
SCALAR = {"add": lambda a, s: a + s, "mul": lambda a, s: a * s, "pow": lambda a, s: a ** s}


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_grad(y, g, scale):
    return scale * y * (g - (g * y).sum(axis=-1, keepdims=True))


def log_softmax(x):
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def layernorm(x, weight, bias, eps):
    """-> (y, mean, rstd) over the last axis. The means are sums divided by n, as x.mean computes them (the same
    bits), without its Python wrapper: a decode step's rows are short, and each call's overhead is its cost."""
    n = x.shape[-1]
    mean = np.add.reduce(x, axis=-1) / n
    centred = x - mean[..., None]
    rstd = 1.0 / np.sqrt(np.add.reduce(centred * centred, axis=-1) / n + eps)
    y = centred * rstd[..., None]
    if weight is not None:
        y *= weight
    if bias is not None:
        y += bias
    return y, mean, rstd


def layernorm_grad(g, x, weight, mean, rstd):
    """-> (g_x, g * xhat): x's gradient, and what the weight's gradient sums over the rows."""
    xhat = (x - mean[..., None]) * rstd[..., None]
    g_xhat = g * weight if weight is not None else g
    g_x = rstd[..., None] * (g_xhat - g_xhat.mean(axis=-1, keepdims=True)
                             - xhat * (g_xhat * xhat).mean(axis=-1, keepdims=True))
    return g_x, g * xhat


def query_rows(T, hs, n_head) -> int:
    """Queries per block of attention: a block's scores, (n_head, queries, T), are about SCORES_BLOCK elements, which
    stay in a core's cache, and the pool runs its products with BLAS on one thread (blas.py). Where BLAS's thread
    count cannot be set, each product also stays at most SMALL_PRODUCT, which OpenBLAS runs on the calling thread."""
    rows = SCORES_BLOCK // (n_head * T)
    if not blas.available():
        rows = min(rows, SMALL_PRODUCT // (T * hs))
    return max(1, min(T, rows))


def rows(a):
    """a (..., n) as rows (N, n)."""
    return a.reshape(-1, a.shape[-1])


def check_range(ids, stop, message, ignore=None):
    """Refuse ids outside [0, stop) (except `ignore`): NumPy would wrap a negative one silently."""
    bad = (ids < 0) | (ids >= stop)
    if ignore is not None:
        bad &= ids != ignore
    if bad.any():
        raise TinynnError(message)


def causal(shape):
    """True above the diagonal of the last two dims: the future positions a token must not see."""
    t_q, t_k = shape[-2], shape[-1]
    return np.triu(np.ones((t_q, t_k), dtype=bool), k=1 + t_k - t_q)


def split_heads(x, n_head):
    """(B, T, C) -> (B, nh, T, hs): head h is columns h*hs:(h+1)*hs."""
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def heads(qkv, n_head):
    """q, k and v of the qkv projection's output (B, T, 3C), each (B, nh, T, hs)."""
    return (split_heads(part, n_head) for part in np.split(qkv, 3, axis=-1))
