"""The NumPy backend: the reference every other backend is tested against.

Each op is the plain textbook formula, written for clarity; results are fresh contiguous arrays so that no
op's output aliases its input (the in-place optimizer updates rely on that). Float ops keep their input's
dtype: float32 for training, float64 for the finite-difference gradient checks.
"""
from __future__ import annotations

import math

import numpy as np

from tinynn.backends import INTERFACE_VERSION, Backend
from tinynn.errors import TinynnError

GELU_C = math.sqrt(2.0 / math.pi)
# the errors for ids out of range, worded alike on every backend (a GPU raises them at its next read-back)
EMBEDDING_RANGE = "embedding: an id is outside [0, num_embeddings)"
TARGET_RANGE = "cross_entropy: a target is outside [0, number of classes) and is not ignore_index"


GELU_EDGE = 12.0  # beyond +-12, 2 x s (1 - s) u' in GELU's gradient is 0 in float32


def _gelu_sigmoid(x):
    """GELU (tanh form, GPT-2's) is 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = GELU_C (x + 0.044715 x^3): this
    sigmoid. It does not cancel: 1 + tanh(u) rounds to 0 in float32 for x < -5.4, where GELU(x) is still ~1e-8 x.
    exp overflows to inf for x < -10 and the sigmoid is then 0, GELU's limit (NumPy's floats are IEEE; the GPU's
    common.wgsl, which may not assume infinities, computes it from exp(-|2u|) instead)."""
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-2 * GELU_C * (x + 0.044715 * x * x * x)))  # x*x*x: float power is ~20x slower


def _check_range(ids, stop, message, ignore=None):
    """Refuse ids outside [0, stop) (except `ignore`): NumPy would wrap a negative one silently."""
    bad = (ids < 0) | (ids >= stop)
    if ignore is not None:
        bad &= ids != ignore
    if bad.any():
        raise TinynnError(message)


def _causal(shape):
    """True above the diagonal of the last two dims: the future positions a token must not see."""
    t_q, t_k = shape[-2], shape[-1]
    return np.triu(np.ones((t_q, t_k), dtype=bool), k=1 + t_k - t_q)


def _split_heads(x, n_head):
    """(B, T, C) -> (B, nh, T, hs): head h is columns h*hs:(h+1)*hs."""
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def _merge_heads(x):
    """(B, nh, T, hs) -> (B, T, C), the inverse of _split_heads."""
    B, nh, T, hs = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)


def _heads(qkv, n_head):
    """q, k and v of the qkv projection's output (B, T, 3C), each (B, nh, T, hs)."""
    return (_split_heads(part, n_head) for part in np.split(qkv, 3, axis=-1))


class NumpyBackend(Backend):
    name = "cpu"
    interface_version = INTERFACE_VERSION
    device_name = "NumPy"

    # --- transfer and creation ---
    def from_numpy(self, x):
        return np.array(x, copy=True)

    def to_numpy(self, a, out=None):
        if out is None:
            return np.array(a, copy=True)
        out[...] = a
        return out

    def is_array(self, a):
        return isinstance(a, np.ndarray)

    def full(self, shape, value, dtype=np.float32):
        return np.full(shape, value, dtype=dtype)

    def write_(self, dst, src):
        dst[...] = src

    # --- layout ---
    def reshape(self, a, shape):
        return a.reshape(shape)

    def permute(self, a, axes):
        return np.ascontiguousarray(a.transpose(axes))

    def broadcast_to(self, a, shape):
        return np.ascontiguousarray(np.broadcast_to(a, shape))

    def getitem(self, a, index):
        return np.array(a[index], copy=True)

    def getitem_backward(self, g, index, shape):
        out = np.zeros(shape, dtype=g.dtype)
        items = index if isinstance(index, tuple) else (index,)
        if all(isinstance(i, (int, np.integer, slice)) or i is None or i is Ellipsis for i in items):
            out[index] = g  # a basic index selects each element at most once
        else:
            np.add.at(out, index, g)  # an index array may repeat: every contribution must land
        return out

    def concatenate(self, arrays, axis):
        return np.concatenate(arrays, axis=axis)

    # --- elementwise ---
    def unary(self, op, a):
        if op == "neg":
            return -a
        if op == "exp":
            return np.exp(a)
        if op == "log":
            return np.log(a)
        if op == "tanh":
            return np.tanh(a)
        if op == "relu":
            return np.maximum(a, 0).astype(a.dtype)
        if op == "gelu":
            return (a * _gelu_sigmoid(a)).astype(a.dtype)
        raise ValueError(f"unknown unary op {op!r}")

    def unary_backward(self, op, x, y, g):
        """Gradient of `y = unary(op, x)` given the output gradient g."""
        if op == "neg":
            return -g
        if op == "exp":
            return g * y
        if op == "log":
            return g / x
        if op == "tanh":
            return g * (1.0 - y * y)
        if op == "relu":
            return g * (x > 0).astype(g.dtype)
        if op == "gelu":  # s + 2 x s (1 - s) u', x clamped where s (1 - s) is 0: finite for every finite x
            s, c = _gelu_sigmoid(x), np.clip(x, -GELU_EDGE, GELU_EDGE)
            return (g * (s + 2 * c * s * (1 - s) * GELU_C * (1 + 3 * 0.044715 * c * c))).astype(g.dtype)
        raise ValueError(f"unknown unary op {op!r}")

    def binary(self, op, a, b):
        if op == "add":
            return a + b
        if op == "sub":
            return a - b
        if op == "mul":
            return a * b
        if op == "div":
            return a / b
        if op == "eq":
            return (a == b).astype(np.result_type(a, b))
        raise ValueError(f"unknown binary op {op!r}")

    def scalar(self, op, a, s):
        if op == "add":
            return a + s
        if op == "mul":
            return a * s
        if op == "pow":
            return a ** s
        raise ValueError(f"unknown scalar op {op!r}")

    def causal_fill(self, x, value):
        return np.where(_causal(x.shape), np.asarray(value, x.dtype), x)

    def dropout_mask(self, shape, p, seed, dtype=np.float32):
        keep = np.random.default_rng(seed).random(shape) >= p
        return (keep / (1.0 - p)).astype(dtype)

    # --- reductions and matmul ---
    def sum(self, a, axes, keepdims=False):
        return np.asarray(a.sum(axis=axes, keepdims=keepdims))

    def max(self, a, axes, keepdims=False):
        return np.asarray(a.max(axis=axes, keepdims=keepdims))

    def matmul(self, a, b, transpose_a=False, transpose_b=False):
        """op(a) @ op(b), batched."""
        if transpose_a:
            a = a.swapaxes(-1, -2)
        if transpose_b:
            b = b.swapaxes(-1, -2)
        return np.matmul(a, b)

    def linear_forward(self, x, weight, bias=None, residual=None, activation=None, for_backward=True):
        pre = x @ weight.T
        if bias is not None:
            pre = pre + bias
        if activation not in (None, "gelu"):
            raise ValueError(f"unknown activation {activation!r}")
        y = pre if activation is None else self.unary(activation, pre)
        if residual is not None:
            y = y + residual
        return y, (pre if activation and for_backward else None)

    def linear_backward(self, g, x, weight, pre=None, activation=None, has_bias=True, x_activation=None, x_pre=None):
        if activation is not None:
            g = self.unary_backward(activation, pre, None, g)  # GELU's gradient needs only its input
        g_x = g @ weight
        if x_activation is not None:
            g_x = self.unary_backward(x_activation, x_pre, None, g_x)
        return g_x, g.T @ x, (g.sum(axis=0) if has_bias else None)

    # --- fused neural-network ops (over the last axis) ---
    def softmax_forward(self, x, causal=False, scale=1.0):
        """softmax(scale * x) over the last axis; `causal` hides the future first (attention's scores)."""
        x = x * scale
        if causal:
            x = self.causal_fill(x, -np.inf)
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)

    def softmax_backward(self, y, g, scale=1.0):
        return (scale * y * (g - (g * y).sum(axis=-1, keepdims=True))).astype(y.dtype)

    def log_softmax_forward(self, x):
        shifted = x - x.max(axis=-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))

    def log_softmax_backward(self, y, g):
        return g - np.exp(y) * g.sum(axis=-1, keepdims=True)

    def layernorm_forward(self, x, weight, bias, eps, for_backward=True):
        mean = x.mean(axis=-1)
        rstd = 1.0 / np.sqrt(((x - mean[..., None]) ** 2).mean(axis=-1) + eps)
        y = (x - mean[..., None]) * rstd[..., None]
        if weight is not None:
            y = y * weight
        if bias is not None:
            y = y + bias
        if not for_backward:
            return y.astype(x.dtype), None, None
        return y.astype(x.dtype), mean.astype(x.dtype), rstd.astype(x.dtype)

    def layernorm_backward(self, g, x, weight, mean, rstd, has_bias=True, g_add=None):
        xhat = (x - mean[..., None]) * rstd[..., None]
        batch_axes = tuple(range(x.ndim - 1))
        g_weight = (g * xhat).sum(axis=batch_axes) if weight is not None else None
        g_bias = g.sum(axis=batch_axes) if has_bias else None
        g_xhat = g * weight if weight is not None else g
        g_x = rstd[..., None] * (g_xhat - g_xhat.mean(axis=-1, keepdims=True)
                                 - xhat * (g_xhat * xhat).mean(axis=-1, keepdims=True))
        if g_add is not None:
            g_x = g_x + g_add
        return g_x.astype(x.dtype), g_weight, g_bias

    def cross_entropy_forward(self, logits, targets, ignore_index, for_backward=True):
        """Mean negative log-likelihood of `targets` (N,) under `logits` (N, C) -> (loss, probs, count)."""
        _check_range(targets, logits.shape[-1], TARGET_RANGE, ignore_index)
        probs = self.softmax_forward(logits)
        valid = targets != ignore_index
        picked = probs[np.arange(len(targets)), np.where(valid, targets, 0)]
        with np.errstate(invalid="ignore", divide="ignore"):  # no valid target: nan, like PyTorch
            loss = -np.log(picked[valid]).sum() / valid.sum()
        if not for_backward:
            return np.asarray(loss, dtype=logits.dtype), None, None
        return np.asarray(loss, dtype=logits.dtype), probs, np.asarray(valid.sum(), dtype=logits.dtype)

    def cross_entropy_backward(self, probs, targets, g_loss, ignore_index, count=None):
        _check_range(targets, probs.shape[-1], TARGET_RANGE, ignore_index)
        valid = targets != ignore_index
        count = valid.sum() if count is None else float(count)
        g = probs.copy()
        g[np.arange(len(targets)), np.where(valid, targets, 0)] -= valid
        g[~valid] = 0
        return (g * (g_loss / max(count, 1))).astype(probs.dtype)

    def classifier_forward(self, x, weight, bias, targets, vocab, ignore_index, for_backward=True):
        """The head's logits, their softmax over the first `vocab` columns, the mean loss and its gradients, whole
        (the specification: a GPU computes them a chunk of rows at a time)."""
        _check_range(targets, vocab, TARGET_RANGE, ignore_index)
        logits = x @ weight.T if bias is None else x @ weight.T + bias  # (N, Vp)
        z = logits[:, :vocab]  # the padded columns take no part
        m = z.max(axis=-1, keepdims=True)
        e = np.exp(z - m)
        s = e.sum(axis=-1, keepdims=True)
        valid = targets != ignore_index
        rows = np.arange(len(targets))
        picked = np.where(valid, targets, 0)
        count = valid.sum()
        with np.errstate(invalid="ignore", divide="ignore"):  # no valid target: nan, like PyTorch
            loss = np.asarray(((np.log(s) + m)[:, 0] - z[rows, picked])[valid].sum() / count, dtype=x.dtype)
        if not for_backward:
            return loss, None, None, None
        g = np.zeros_like(logits)  # the logits' gradient: softmax - onehot(target), zero on ignored rows
        g[:, :vocab] = e / s
        g[rows, picked] -= 1
        g[~valid] = 0
        g /= max(count, 1)
        return loss, g @ weight, g.T @ x, (g.sum(axis=0) if bias is not None else None)

    def embedding_forward(self, weight, idx):
        _check_range(idx, len(weight), EMBEDDING_RANGE)
        return weight[idx]

    def embedding_backward(self, g, idx, num_embeddings):
        _check_range(idx, num_embeddings, EMBEDDING_RANGE)
        out = np.zeros((num_embeddings, g.shape[-1]), dtype=g.dtype)
        np.add.at(out, idx.reshape(-1), g.reshape(-1, g.shape[-1]))
        return out

    def embedding_with_positions_forward(self, wte, wpe, idx):
        _check_range(idx, len(wte), EMBEDDING_RANGE)
        return wte[idx] + wpe[:idx.shape[-1]]  # (..., T, C) + (T, C)

    def embedding_with_positions_backward(self, g, idx, num_embeddings, num_positions):
        t, c = g.shape[-2:]
        g_wpe = np.zeros((num_positions, c), dtype=g.dtype)
        g_wpe[:t] = g.reshape(-1, t, c).sum(axis=0)
        return self.embedding_backward(g, idx, num_embeddings), g_wpe

    def attention_forward(self, qkv, n_head, scale, for_backward=True):
        """The plain formula, with the T x T scores: the specification the fused kernels are tested against."""
        q, k, v = _heads(qkv, n_head)  # each (B, nh, T, hs)
        s = np.where(_causal((q.shape[-2], k.shape[-2])), -np.inf, scale * (q @ k.swapaxes(-1, -2)))  # (B, nh, T, T)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - m)
        total = e.sum(axis=-1, keepdims=True)
        y = (e / total) @ v  # (B, nh, T, hs)
        lse = (m + np.log(total))[..., 0]  # (B, nh, T)
        return _merge_heads(y).astype(qkv.dtype), (lse.astype(qkv.dtype) if for_backward else None)

    def attention_backward(self, g, qkv, y, lse, n_head, scale):
        q, k, v = _heads(qkv, n_head)  # each (B, nh, T, hs)
        g_y, y_h = _split_heads(g, n_head), _split_heads(y, n_head)  # (B, nh, T, hs)
        s = scale * (q @ k.swapaxes(-1, -2))  # (B, nh, T, T)
        p = np.where(_causal(s.shape), 0.0, np.exp(s - lse[..., None]))
        g_p = g_y @ v.swapaxes(-1, -2)  # (B, nh, T, T)
        g_s = p * (g_p - (g_y * y_h).sum(axis=-1, keepdims=True))  # softmax's backward, its row dot from y
        g_q, g_k, g_v = scale * (g_s @ k), scale * (g_s.swapaxes(-1, -2) @ q), p.swapaxes(-1, -2) @ g_y
        g_qkv = np.stack([g_q, g_k, g_v]).transpose(1, 3, 0, 2, 4)  # (B, T, 3, nh, hs)
        return g_qkv.reshape(qkv.shape).astype(qkv.dtype)

    # --- optimizer ---
    def global_norm(self, arrays):
        total = sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays)
        return np.asarray(math.sqrt(total), dtype=arrays[0].dtype)

    def global_norm_and_clip(self, arrays, max_norm):
        norm = self.global_norm(arrays)
        return norm, np.asarray(min(1.0, max_norm / (float(norm) + 1e-6)), dtype=norm.dtype)

    def adamw_update_(self, params, grads, exp_avgs, exp_avg_sqs, hyper, *, beta1, beta2, eps, weight_decay,
                      grad_scale=None):
        """hyper = [lr, 1 - beta1^t, 1 - beta2^t]: the values that change every step, kept in an array."""
        scale = 1.0 if grad_scale is None else float(grad_scale)
        lr, bias1, bias2 = (float(v) for v in hyper)
        decays = weight_decay if isinstance(weight_decay, (list, tuple)) else [weight_decay] * len(params)
        for p, g, m, v, decay in zip(params, grads, exp_avgs, exp_avg_sqs, decays):
            g = g * scale
            p *= 1.0 - lr * decay  # decoupled weight decay (Loshchilov & Hutter)
            m *= beta1
            m += (1.0 - beta1) * g
            v *= beta2
            v += (1.0 - beta2) * g * g
            p -= lr * (m / bias1) / (np.sqrt(v / bias2) + eps)

    def sgd_update_(self, params, grads, momentum_buffers, hyper, *, momentum, weight_decay, grad_scale=None):
        """hyper = [lr]."""
        scale = 1.0 if grad_scale is None else float(grad_scale)
        lr = float(hyper[0])
        for p, g, buf in zip(params, grads, momentum_buffers):
            g = g * scale + weight_decay * p
            buf *= momentum
            buf += g
            p -= lr * buf

    # --- data parallel ---
    def pack(self, arrays):
        return np.concatenate([a.reshape(-1) for a in arrays])

    def unpack(self, flat, shapes):
        ends = np.cumsum([math.prod(shape) for shape in shapes])
        assert ends[-1] == flat.size, f"shapes of {ends[-1]} elements do not cover {flat.size}"
        return [piece.reshape(shape) for piece, shape in zip(np.split(flat.copy(), ends[:-1]), shapes)]

    # --- generation ---
    def embed_window(self, wte, wpe, tokens, length, count):
        n, block = int(length[0]), wpe.shape[0]
        index = np.arange(n - count, n)  # the tokens' places in the whole sequence
        return wte[tokens[:, index % tokens.shape[1]]] + wpe[index - max(0, n - block)]  # (B, count, C)

    def kv_cache_write_(self, k_cache, v_cache, qkv, length):
        c, t = k_cache.shape[2], qkv.shape[1]
        start = min(int(length[0]), k_cache.shape[1]) - t
        k_cache[:, start:start + t] = qkv[:, :, c:2 * c]
        v_cache[:, start:start + t] = qkv[:, :, 2 * c:]

    def attention_decode(self, qkv, k_cache, v_cache, length, n_head, scale):
        b, _, c = k_cache.shape
        rows, hs = min(int(length[0]), k_cache.shape[1]), c // n_head
        q = qkv[:, :, :c].reshape(b, n_head, 1, hs)  # (B, nh, 1, hs): one position, so no transpose
        k = k_cache[:, :rows].reshape(b, rows, n_head, hs).transpose(0, 2, 3, 1)  # (B, nh, hs, rows)
        v = v_cache[:, :rows].reshape(b, rows, n_head, hs).transpose(0, 2, 1, 3)  # (B, nh, rows, hs)
        att = self.softmax_forward(q @ k, scale=scale)  # (B, nh, 1, rows)
        return (att @ v).reshape(b, 1, c)  # (B, nh, 1, hs) -> (B, 1, C)

    def sample_tokens_(self, logits, tokens, length, ids, *, temperature, top_k, seed):
        n, (b, v) = int(length[0]), logits.shape
        if temperature == 0:
            draw = logits.argmax(axis=-1)
        else:
            kept = logits >= np.sort(logits, axis=-1)[:, v - min(top_k, v)][:, None]
            top = logits.max(axis=-1, keepdims=True)
            p = np.where(kept, np.exp((logits - top) / np.float32(temperature)), np.float32(0))
            running = np.cumsum(p, axis=-1, dtype=np.float32)
            target = uniform(seed, np.arange(b), n) * running[:, -1]
            draw = (running <= target[:, None]).sum(axis=-1)  # the first index whose running sum exceeds
            last_kept = v - 1 - kept[:, ::-1].argmax(axis=-1)
            draw = np.minimum(draw, last_kept)  # target rounded up to the total: the last kept token
        ids[...] = draw
        tokens[:, n % tokens.shape[1]] = draw

    def advance_(self, length):
        length += 1


def _pcg(x):
    """PCG's output permutation as a hash of uint32 values (decode.wgsl has the same)."""
    state = x * np.uint32(747796405) + np.uint32(2891336453)
    word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
    return (word >> np.uint32(22)) ^ word


def uniform(seed: int, sequence: np.ndarray, n: int) -> np.ndarray:
    """u in [0, 1) (24 bits, float32) for each sequence's draw of token n, a pure function of its inputs."""
    h = _pcg(_pcg(_pcg(np.full(len(sequence), n, np.uint32)) ^ sequence.astype(np.uint32)) ^ np.uint32(seed))
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


NUMPY = NumpyBackend()
