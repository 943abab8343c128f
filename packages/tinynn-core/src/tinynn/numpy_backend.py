"""The NumPy backend: the reference every other backend is tested against.

Each op is the plain textbook formula, written for clarity; results are fresh contiguous arrays so that no
op's output aliases its input (the in-place optimizer updates rely on that). Float ops keep their input's
dtype: float32 for training, float64 for the finite-difference gradient checks.

Large float arrays go through the same formulas one block of rows at a time, on the thread pool (parallel.py):
an elementwise or row-wise formula gives the same bits by blocks as in one piece, and the blocks' temporaries
stay in cache. Sums across rows (bias and LayerNorm gradients, the gradient norm) add per-block partial sums in
block order: the same bits for every thread count. Matrix products run on the pool too, by tiles of their output
(`parallel.matmul`), a linear layer's bias, activation and residual added to each tile while it is in cache.
"""
from __future__ import annotations

import math

import numpy as np

from tinynn import blas, heap, parallel
from tinynn import numpy_formulas as formulas
from tinynn.backends import INTERFACE_VERSION, Backend

# the errors for ids out of range, worded alike on every backend (a GPU raises them at its next read-back)
EMBEDDING_RANGE = "embedding: an id is outside [0, num_embeddings)"
TARGET_RANGE = "cross_entropy: a target is outside [0, number of classes) and is not ignore_index"


class NumpyBackend(Backend):
    name = "cpu"
    interface_version = INTERFACE_VERSION
    device_name = "NumPy"

    def describe(self) -> dict:
        """... and the thread pool's size and how it runs products, which `tinynn info` shows."""
        pool = parallel.describe()
        threads = f"{pool['threads']} (from {pool['from']}; {pool['cores']} cores available)"
        products = ("by tiles on the pool, OpenBLAS on one thread (a decode step's: whole, on OpenBLAS's threads)"
                    if blas.available()
                    else "whole, on NumPy's BLAS and its own threads")
        return {**super().describe(), "threads": threads, "products": products}

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
        if op not in formulas.UNARY:
            raise ValueError(f"unknown unary op {op!r}")
        return parallel.elementwise(formulas.UNARY[op], a)

    def unary_backward(self, op, x, y, g):
        """Gradient of `y = unary(op, x)` given the output gradient g."""
        if op not in formulas.UNARY_BACKWARD:
            raise ValueError(f"unknown unary op {op!r}")
        formula = formulas.UNARY_BACKWARD[op]
        if y is None:  # GELU's and ReLU's gradients need only their input
            return parallel.elementwise(lambda x, g: formula(x, None, g), x, g)
        return parallel.elementwise(formula, x, y, g)

    def binary(self, op, a, b):
        if op not in formulas.BINARY:
            raise ValueError(f"unknown binary op {op!r}")
        formula = formulas.BINARY[op]
        if a.shape != b.shape and b.ndim == 1 and a.shape[-1:] == b.shape and a.dtype == b.dtype \
                and not parallel.small(a):  # a row vector (a bias) against every row
            out = formulas.rows(np.empty(a.shape, a.dtype))
            return parallel.into(lambda rows: formula(rows, b), out, formulas.rows(a),
                                 row_size=a.shape[-1]).reshape(a.shape)
        return parallel.elementwise(formula, a, b)

    def scalar(self, op, a, s):
        if op not in formulas.SCALAR:
            raise ValueError(f"unknown scalar op {op!r}")
        formula = formulas.SCALAR[op]
        return parallel.elementwise(lambda a: formula(a, s), a)

    def causal_fill(self, x, value):
        return np.where(formulas.causal(x.shape), np.asarray(value, x.dtype), x)

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
        if a.ndim == b.ndim == 2 and a.dtype.kind == b.dtype.kind == "f":
            return parallel.matmul(a, b)
        return np.matmul(a, b)

    def linear_forward(self, x, weight, bias=None, residual=None, activation=None, for_backward=True):
        if activation not in (None, "gelu"):
            raise ValueError(f"unknown activation {activation!r}")
        shape = x.shape[:-1] + weight.shape[:1]
        keep = activation is not None and for_backward
        pre = np.empty(shape, np.result_type(x, weight)) if keep else None
        res = None if residual is None else formulas.rows(residual)

        def epilogue(tile, rows, cols):  # in place on the product's tile, this op's own
            if bias is not None:
                tile += bias[cols]
            if activation is not None:
                if keep:
                    formulas.rows(pre)[rows, cols] = tile
                formulas.gelu(tile, out=tile)  # the only activation, in place
            if res is not None:
                tile += res[rows, cols]
        plain = bias is None and activation is None and residual is None
        y = parallel.matmul(formulas.rows(x), weight.T, None if plain else epilogue)  # one product for all rows
        return y.reshape(shape), pre

    def linear_backward(self, g, x, weight, pre=None, activation=None, has_bias=True, x_activation=None, x_pre=None):
        if activation is not None:
            g = self.unary_backward(activation, pre, None, g)  # GELU's gradient needs only its input

        def activation_grad(tile, rows, cols):  # x_activation's gradient on each tile of g_x (its input's only)
            tile[...] = formulas.UNARY_BACKWARD[x_activation](x_pre[rows, cols], None, tile)
        g_x = parallel.matmul(g, weight, None if x_activation is None else activation_grad)
        g_b = parallel.column_sums(lambda lo, hi: g[lo:hi], *g.shape, g.shape[1], g.dtype) if has_bias else None
        return g_x, parallel.matmul(g.T, x), g_b

    # --- fused neural-network ops (over the last axis) ---
    def softmax_forward(self, x, causal=False, scale=1.0):
        """softmax(scale * x) over the last axis; `causal` hides the future first (attention's scores)."""
        formula = lambda rows: formulas.softmax(rows * scale)  # noqa: E731
        if causal:
            x, formula = self.causal_fill(x * scale, -np.inf), formulas.softmax
        return parallel.by_blocks(formula, lambda: formulas.rows(np.empty_like(x)), formulas.rows(x),
                                  row_size=x.shape[-1]).reshape(x.shape)

    def softmax_backward(self, y, g, scale=1.0):
        return parallel.by_blocks(lambda y, g: formulas.softmax_grad(y, g, scale),
                                  lambda: formulas.rows(np.empty_like(y)), formulas.rows(y),
                                  formulas.rows(g), row_size=y.shape[-1]).reshape(y.shape)

    def log_softmax_forward(self, x):
        return parallel.by_blocks(formulas.log_softmax, lambda: formulas.rows(np.empty_like(x)), formulas.rows(x),
                                  row_size=x.shape[-1]).reshape(x.shape)

    def log_softmax_backward(self, y, g):
        return g - np.exp(y) * g.sum(axis=-1, keepdims=True)

    def layernorm_forward(self, x, weight, bias, eps, for_backward=True):
        rows = len(formulas.rows(x))

        def outputs():
            return formulas.rows(np.empty_like(x)), np.empty(rows, x.dtype), np.empty(rows, x.dtype)
        y, mean, rstd = parallel.by_blocks(lambda x: formulas.layernorm(x, weight, bias, eps), outputs,
                                           formulas.rows(x), row_size=x.shape[-1])
        y, mean, rstd = y.reshape(x.shape), mean.reshape(x.shape[:-1]), rstd.reshape(x.shape[:-1])
        return (y, mean, rstd) if for_backward else (y, None, None)

    def layernorm_backward(self, g, x, weight, mean, rstd, has_bias=True, g_add=None):
        g_rows, x_rows, mean, rstd = formulas.rows(g), formulas.rows(x), mean.reshape(-1), rstd.reshape(-1)
        spans, width = parallel.blocks(*x_rows.shape), x.shape[-1]
        g_x = np.empty_like(x)
        sums = np.empty((2, len(spans), width), x.dtype)  # per block: the rows' sums of g * xhat and of g

        def block(i):
            lo, hi = spans[i]
            g_x_rows, g_xhat = formulas.layernorm_grad(g_rows[lo:hi], x_rows[lo:hi], weight, mean[lo:hi], rstd[lo:hi])
            formulas.rows(g_x)[lo:hi] = g_x_rows if g_add is None else g_x_rows + formulas.rows(g_add)[lo:hi]
            np.sum(g_xhat, axis=0, out=sums[0, i])
            np.sum(g_rows[lo:hi], axis=0, out=sums[1, i])
        parallel.run(block, list(range(len(spans))))
        g_weight, g_bias = sums.sum(axis=1)
        return g_x, (g_weight if weight is not None else None), (g_bias if has_bias else None)

    def cross_entropy_forward(self, logits, targets, ignore_index, for_backward=True):
        """Mean negative log-likelihood of `targets` (N,) under `logits` (N, C) -> (loss, probs, count)."""
        formulas.check_range(targets, logits.shape[-1], TARGET_RANGE, ignore_index)
        probs = self.softmax_forward(logits)
        valid = targets != ignore_index
        picked = probs[np.arange(len(targets)), np.where(valid, targets, 0)]
        with np.errstate(invalid="ignore", divide="ignore"):  # no valid target: nan, like PyTorch
            loss = -np.log(picked[valid]).sum() / valid.sum()
        if not for_backward:
            return np.asarray(loss, dtype=logits.dtype), None, None
        return np.asarray(loss, dtype=logits.dtype), probs, np.asarray(valid.sum(), dtype=logits.dtype)

    def cross_entropy_backward(self, probs, targets, g_loss, ignore_index, count=None):
        formulas.check_range(targets, probs.shape[-1], TARGET_RANGE, ignore_index)
        valid = targets != ignore_index
        count = valid.sum() if count is None else float(count)
        g = probs.copy()
        g[np.arange(len(targets)), np.where(valid, targets, 0)] -= valid
        g[~valid] = 0
        return (g * (g_loss / max(count, 1))).astype(probs.dtype)

    def classifier_forward(self, x, weight, bias, targets, vocab, ignore_index, for_backward=True):
        """The head's logits, their softmax over the first `vocab` columns, the mean loss and its gradients, whole
        (the specification: a GPU computes them a chunk of rows at a time)."""
        formulas.check_range(targets, vocab, TARGET_RANGE, ignore_index)
        logits = parallel.matmul(x, weight.T)  # (N, Vp)
        if bias is not None:
            logits += bias
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
        return loss, parallel.matmul(g, weight), parallel.matmul(g.T, x), (g.sum(axis=0) if bias is not None else None)

    def embedding_forward(self, weight, idx):
        formulas.check_range(idx, len(weight), EMBEDDING_RANGE)
        return weight[idx]

    def embedding_backward(self, g, idx, num_embeddings):
        formulas.check_range(idx, num_embeddings, EMBEDDING_RANGE)
        out = np.zeros((num_embeddings, g.shape[-1]), dtype=g.dtype)
        np.add.at(out, idx.reshape(-1), g.reshape(-1, g.shape[-1]))
        return out

    def embedding_with_positions_forward(self, wte, wpe, idx):
        formulas.check_range(idx, len(wte), EMBEDDING_RANGE)
        return wte[idx] + wpe[:idx.shape[-1]]  # (..., T, C) + (T, C)

    def embedding_with_positions_backward(self, g, idx, num_embeddings, num_positions):
        t, c = g.shape[-2:]
        g_wpe = np.zeros((num_positions, c), dtype=g.dtype)
        g_wpe[:t] = g.reshape(-1, t, c).sum(axis=0)
        return self.embedding_backward(g, idx, num_embeddings), g_wpe

    def attention_forward(self, qkv, n_head, scale, for_backward=True):
        """The plain formula, with the T x T scores: the specification the fused kernels are tested against. Each
        (sequence, block of queries) on the pool, every head at once, over the keys up to its last query (the rest
        are masked)."""
        q, k, v = formulas.heads(qkv, n_head)  # each (B, nh, T, hs)
        B, nh, T, hs = q.shape
        y, lse = np.empty(qkv.shape[:-1] + (nh * hs,), qkv.dtype), np.empty((B, nh, T), qkv.dtype)
        y_h, future, rows = formulas.split_heads(y, n_head), formulas.causal((T, T)), formulas.query_rows(T, hs, nh)

        def piece(item):
            b, lo = item
            hi = min(lo + rows, T)
            s = np.where(future[lo:hi, :hi], -np.inf,
                         scale * (q[b, :, lo:hi] @ k[b, :, :hi].swapaxes(-1, -2)))  # (nh, rows, hi)
            m = s.max(axis=-1, keepdims=True)
            e = np.exp(s - m)
            total = e.sum(axis=-1, keepdims=True)
            y_h[b, :, lo:hi] = (e / total) @ v[b, :, :hi]  # (nh, rows, hs)
            lse[b, :, lo:hi] = (m + np.log(total))[..., 0]
        with blas.one_thread():
            parallel.run(piece, [(b, lo) for b in range(B) for lo in range(0, T, rows)])
        return y, (lse if for_backward else None)

    def attention_backward(self, g, qkv, y, lse, n_head, scale):
        """Each sequence on the pool, every head at once; its keys' and values' gradients add up over its blocks of
        queries."""
        q, k, v = formulas.heads(qkv, n_head)  # each (B, nh, T, hs)
        g_y, y_h = formulas.split_heads(g, n_head), formulas.split_heads(y, n_head)  # (B, nh, T, hs)
        B, nh, T, hs = q.shape
        g_qkv = np.empty(qkv.shape, qkv.dtype)
        g_q, g_k, g_v = formulas.heads(g_qkv, n_head)  # views of g_qkv
        future, rows = formulas.causal((T, T)), formulas.query_rows(T, hs, nh)

        def sequence(b):
            g_keys, g_values = np.zeros((nh, T, hs), g.dtype), np.zeros((nh, T, hs), g.dtype)
            for lo in range(0, T, rows):
                hi = min(lo + rows, T)
                s = scale * (q[b, :, lo:hi] @ k[b, :, :hi].swapaxes(-1, -2))  # (nh, rows, hi)
                p = np.where(future[lo:hi, :hi], 0.0, np.exp(s - lse[b, :, lo:hi, None]))
                g_p = g_y[b, :, lo:hi] @ v[b, :, :hi].swapaxes(-1, -2)  # (nh, rows, hi)
                row_dot = (g_y[b, :, lo:hi] * y_h[b, :, lo:hi]).sum(axis=-1, keepdims=True)  # softmax's, from y
                g_s = p * (g_p - row_dot)
                g_q[b, :, lo:hi] = scale * (g_s @ k[b, :, :hi])
                g_keys[:, :hi] += scale * (g_s.swapaxes(-1, -2) @ q[b, :, lo:hi])
                g_values[:, :hi] += p.swapaxes(-1, -2) @ g_y[b, :, lo:hi]
            g_k[b], g_v[b] = g_keys, g_values
        with blas.one_thread():
            parallel.run(sequence, list(range(B)))
        return g_qkv

    # --- optimizer: every array cut into blocks, all blocks of all arrays in one run on the pool ---
    def global_norm(self, arrays):
        pieces = parallel.pieces(arrays)
        squares = [0.0] * len(pieces)

        def block(i):
            a, = parallel.piece(pieces[i], arrays)
            squares[i] = float((a.astype(np.float64) ** 2).sum())
        parallel.run(block, list(range(len(pieces))))
        return np.asarray(math.sqrt(sum(squares)), dtype=arrays[0].dtype)

    def global_norm_and_clip(self, arrays, max_norm):
        norm = self.global_norm(arrays)
        return norm, np.asarray(min(1.0, max_norm / (float(norm) + 1e-6)), dtype=norm.dtype)

    def adamw_update_(self, params, grads, exp_avgs, exp_avg_sqs, hyper, *, beta1, beta2, eps, weight_decay,
                      grad_scale=None):
        """hyper = [lr, 1 - beta1^t, 1 - beta2^t]: the values that change every step, kept in an array."""
        scale = 1.0 if grad_scale is None else float(grad_scale)
        lr, bias1, bias2 = (float(v) for v in hyper)
        decays = weight_decay if isinstance(weight_decay, (list, tuple)) else [weight_decay] * len(params)

        def update(piece):
            p, g, m, v = parallel.piece(piece, params, grads, exp_avgs, exp_avg_sqs)
            g = g * scale
            p *= 1.0 - lr * decays[piece[0]]  # decoupled weight decay (Loshchilov & Hutter)
            m *= beta1
            m += (1.0 - beta1) * g
            v *= beta2
            v += (1.0 - beta2) * g * g
            p -= lr * (m / bias1) / (np.sqrt(v / bias2) + eps)
        parallel.run(update, parallel.pieces(params, grads, exp_avgs, exp_avg_sqs))

    def sgd_update_(self, params, grads, momentum_buffers, hyper, *, momentum, weight_decay, grad_scale=None):
        """hyper = [lr]."""
        scale = 1.0 if grad_scale is None else float(grad_scale)
        lr = float(hyper[0])

        def update(piece):
            p, g, buf = parallel.piece(piece, params, grads, momentum_buffers)
            g = g * scale + weight_decay * p
            buf *= momentum
            buf += g
            p -= lr * buf
        parallel.run(update, parallel.pieces(params, grads, momentum_buffers))

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
    """PCG's output permutation as a hash of uint32 values (common.wgsl's pcg)."""
    state = x * np.uint32(747796405) + np.uint32(2891336453)
    word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
    return (word >> np.uint32(22)) ^ word


def uniform(seed: int, sequence: np.ndarray, n: int) -> np.ndarray:
    """u in [0, 1) (24 bits, float32) for each sequence's draw of token n, a pure function of its inputs."""
    h = _pcg(_pcg(_pcg(np.full(len(sequence), n, np.uint32)) ^ sequence.astype(np.uint32)) ^ np.uint32(seed))
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


NUMPY = NumpyBackend()
heap.keep_freed_memory()  # each step's arrays reuse the last step's memory (heap.py)
