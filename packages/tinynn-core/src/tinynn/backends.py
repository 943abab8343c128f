"""Backends: where a Tensor's numbers live and how its operations run.

Core computes only through a `Backend`: this module is its interface, each op's default body the counted
NumPy reference (numpy_backend.py). Which backends exist and which one runs is the registry's (registry.py).
"""
from __future__ import annotations

import contextlib
import functools
from collections import Counter

import numpy as np

from tinynn import precision

# The version of the interface below. It goes up when an op is added or changes its signature or meaning; a
# backend states the version it implements (`Backend.interface_version`), and one written for another
# version is not used: its reason names both.
INTERFACE_VERSION = 5


class BackendUnavailable(Exception):
    """Raised by a backend factory (the callable an entry point names, see registry.py) that cannot run here (no adapter, no driver); the message is the reason."""


def reference_fallback(method):
    """Mark a `Backend` method as an op of the interface and give it its default: move the inputs to NumPy,
    run the reference op of the same name (numpy_backend.py), move the result back, and count the call in
    `fallbacks`. An in-place op (name ending in `_`) writes the reference's results back into this backend's
    arrays. So a backend without its own kernel for an op is slow there, never wrong. The decorated body is
    only the signature and the docstring: what a reader's go-to-definition should land on."""
    name = method.__name__
    inplace = name.endswith("_")

    @functools.wraps(method)
    def fallback(self, *args, **kwargs):
        self.fallbacks[name] += 1
        np_args = _to_numpy(self, args)
        np_kwargs = {key: _to_numpy(self, value) for key, value in kwargs.items()}  # x_pre=, say
        out = getattr(reference(), name)(*np_args, **np_kwargs)
        if not inplace:
            return _from_numpy(self, out)
        for dst, src in zip(_flatten((*args, *kwargs.values())), _flatten((*np_args, *np_kwargs.values()))):
            if self.is_array(dst):
                self.write_(dst, src)
        return None
    fallback.is_op = True
    return fallback


class Backend:
    """The operations core needs, at the level a GPU kernel implements them.

    A forward whose backward reads outputs of its own (LayerNorm's mean and rstd, say) takes `for_backward`:
    False where no backward will run (under no_grad), and those outputs come back as None, never made.

    Arrays are opaque to core except for `.shape` (a tuple of ints), `.dtype`, `.ndim` and `.size`. Transfer and
    creation (`from_numpy`, `to_numpy`, `is_array`, `write_`) every backend implements; every op marked
    `@reference_fallback` has the NumPy reference as its default. Floating-point ops keep their input's dtype.
    """

    name = "abstract"
    interface_version: int | None = None  # the INTERFACE_VERSION a backend implements: each states its own
    is_gpu = False
    is_software = False  # a CPU-emulated adapter (lavapipe): usable, but `auto` does not pick it
    device_name = ""

    def __init__(self):
        self.fallbacks = Counter()

    def describe(self) -> dict:
        effective, why = self.matmul_precision()
        asked = precision.current()
        said = effective if effective == asked else f"{asked} asked for, runs as {effective}"
        return {"backend": self.name, "device": self.device_name, "software": self.is_software,
                "matmul_precision": f"{said} ({why})"}

    def matmul_precision(self) -> tuple[str, str]:
        """(the precision this backend's matmuls run in under `precision.current()`, why): float32 here."""
        return "highest", "float32 products and sums: this backend has no reduced-precision products"

    @classmethod
    def ops(cls) -> tuple[str, ...]:
        """The names of the interface's ops (the methods marked `@reference_fallback`)."""
        return tuple(name for name, fn in vars(Backend).items() if getattr(fn, "is_op", False))

    # --- transfer (every backend implements these) ---
    def from_numpy(self, x: np.ndarray):
        """A new array of this backend holding a copy of x."""
        raise NotImplementedError

    def to_numpy(self, a, out: np.ndarray | None = None) -> np.ndarray:
        """A NumPy copy of a (on a GPU: the host waits for the work that writes a); with `out` (a's shape and
        dtype), written into out and returned: a host buffer reused every step (data-parallel training's)."""
        raise NotImplementedError

    def is_array(self, a) -> bool:
        raise NotImplementedError

    def write_(self, dst, src: np.ndarray) -> None:
        """Overwrite an existing array with host values (same shape), keeping its storage."""
        raise NotImplementedError

    def sync(self) -> None:
        """Wait until all work recorded so far has finished."""

    def capture(self, fn, key=None, copy_result=True):
        """A callable equivalent to `fn()` (no arguments) that the backend may record once and replay.

        fn must read its per-call inputs from arrays that live across calls (written with `write_`
        before each call) and return a Tensor, or None when its caller needs no result. A replay returns the
        result in an array of its own; with copy_result=False, in the step's own array, which the next call
        overwrites (for a caller that reads it at once: no copy). `key`, when given, is a callable returning
        what fn's work depends on besides those arrays' values (arrays it uses, hyperparameters, shapes): a
        replaying backend records again when it changes. The default runs fn every time; a GPU backend replays
        the recorded dispatches without running Python again.
        """
        return fn

    def transient(self):
        """A context for work whose shapes are one-offs (a generator's prompt, its window growing a token at a
        time): a backend that tunes kernels per shape runs its defaults for them, neither tuning nor keeping a
        choice. The default does nothing."""
        return contextlib.nullcontext()

    # --- creation and layout ---
    @reference_fallback
    def full(self, shape: tuple, value: float, dtype=np.float32):
        """A new array of `shape` with every element `value`."""

    @reference_fallback
    def reshape(self, a, shape: tuple):
        """a with a new shape of the same size (a contiguous array: no data moves)."""

    @reference_fallback
    def permute(self, a, axes: tuple):
        """A contiguous copy of a with its axes reordered: result axis i is a's axis axes[i]."""

    @reference_fallback
    def broadcast_to(self, a, shape: tuple):
        """A contiguous copy of a broadcast to `shape` (NumPy's rules)."""

    @reference_fallback
    def getitem(self, a, index):
        """A copy of a[index]: NumPy indexing, basic (ints, slices, None, Ellipsis) or with index arrays."""

    @reference_fallback
    def getitem_backward(self, g, index, shape: tuple):
        """Gradient of getitem: zeros of `shape` with g added at `index` (repeated indices add up)."""

    @reference_fallback
    def concatenate(self, arrays: list, axis: int):
        """The arrays joined along `axis`."""

    # --- elementwise ---
    @reference_fallback
    def unary(self, op: str, a):
        """op(a) elementwise; op is neg, exp, log, tanh, relu or gelu (the tanh approximation)."""

    @reference_fallback
    def unary_backward(self, op: str, x, y, g):
        """Gradient of y = unary(op, x) given the output gradient g."""

    @reference_fallback
    def binary(self, op: str, a, b):
        """a op b elementwise with broadcasting; op is add, sub, mul, div or eq (1 where equal, else 0)."""

    @reference_fallback
    def scalar(self, op: str, a, s: float):
        """a op s for a Python number s; op is add, mul or pow."""

    @reference_fallback
    def causal_fill(self, x, value: float):
        """x with `value` wherever key j > query i over the last two axes (the future a token must not see)."""

    @reference_fallback
    def dropout_mask(self, shape: tuple, p: float, seed: int, dtype=np.float32):
        """A mask of 0 (probability p) and 1 / (1 - p), drawn from `seed`."""

    # --- reductions and matmul ---
    @reference_fallback
    def sum(self, a, axes: tuple, keepdims=False):
        """The sum over `axes`."""

    @reference_fallback
    def max(self, a, axes: tuple, keepdims=False):
        """The maximum over `axes` (NaN wins, as in NumPy)."""

    @reference_fallback
    def matmul(self, a, b, transpose_a=False, transpose_b=False):
        """op(a) @ op(b), op a transpose of the last two axes where asked; batched over the leading axes
        (equal, or b 2-D and shared by every batch). A linear layer is `linear_forward`."""

    @reference_fallback
    def linear_forward(self, x, weight, bias=None, residual=None, activation=None, for_backward=True):
        """A linear layer with its neighbours fused: y = activation(x @ weight.T + bias) + residual for x (..., in)
        and weight (out, in); bias (out,), residual (..., out) and activation ("gelu") each optional.
        -> (y, pre), both (..., out): pre is the activation's input, kept for the backward (None without an
        activation, or without for_backward)."""

    @reference_fallback
    def linear_backward(self, g, x, weight, pre=None, activation=None, has_bias=True, x_activation=None, x_pre=None):
        """Gradients (g_x, g_weight, g_bias or None) of linear_forward given g = dL/dy (the residual's gradient
        is g itself), its arrays as rows: g (N, out), x and g_x (N, in), and `pre` (N, out), the forward's as
        rows, with the `activation` it took. With x_activation, x is x_activation(x_pre), the previous layer's
        fused activation (an MLP's GELU), and g_x is the gradient of x_pre: the activation's derivative applied
        as g_x is computed, not by a pass of its own."""

    # --- fused neural-network ops (over the last axis) ---
    @reference_fallback
    def softmax_forward(self, x, causal=False, scale=1.0):
        """softmax(scale * x) over the last axis; `causal` hides the future first (attention's scores)."""

    @reference_fallback
    def softmax_backward(self, y, g, scale=1.0):
        """Gradient of y = softmax_forward(x, causal, scale) given the output gradient g."""

    @reference_fallback
    def log_softmax_forward(self, x):
        """log(softmax(x)) over the last axis."""

    @reference_fallback
    def log_softmax_backward(self, y, g):
        """Gradient of y = log_softmax_forward(x) given the output gradient g."""

    @reference_fallback
    def layernorm_forward(self, x, weight, bias, eps: float, for_backward=True):
        """LayerNorm over the last axis -> (y, mean, rstd); weight and bias (C,) may each be None; mean and
        rstd None without for_backward."""

    @reference_fallback
    def layernorm_backward(self, g, x, weight, mean, rstd, has_bias=True, g_add=None):
        """Gradients (g_x, g_weight or None, g_bias or None) from the forward's saved mean and rstd. g_add (x's
        shape), when given, is x's gradient from its other uses, added into g_x in the same pass: in a pre-norm
        block x also feeds the residual stream, whose gradient would otherwise cost an add of its own."""

    @reference_fallback
    def cross_entropy_forward(self, logits, targets, ignore_index: int, for_backward=True):
        """Mean negative log-likelihood of integer `targets` (N,) under `logits` (N, C), rows whose target is
        `ignore_index` left out -> (loss scalar, probs (N, C) and count, the number of valid targets as a
        scalar array: what the backward needs; both None without for_backward)."""

    @reference_fallback
    def cross_entropy_backward(self, probs, targets, g_loss, ignore_index: int, count=None):
        """Gradient of the loss with respect to the logits, scaled by the scalar array g_loss; count as the
        forward returned it (counted here when None)."""

    @reference_fallback
    def classifier_forward(self, x, weight, bias, targets, vocab: int, ignore_index: int, for_backward=True):
        """The output head and its mean cross entropy as one op (llm.c's fused classifier): logits
        x @ weight.T + bias for rows x (N, C) and weight (V_padded, C), bias (V_padded,) or None; their softmax over
        the first `vocab` columns only (the rest pad the table to a size matmuls like, and take no probability);
        the mean over rows whose target (N,) is not `ignore_index` of -log softmax[target] -> (loss scalar, g_x
        (N, C), g_weight (V_padded, C), g_bias or None): the loss's gradients, all None without for_backward.
        They are made here, where the logits are: a backend may take a chunk of rows at a time, the logits'
        gradient overwriting them in place and going into the head's two products at once, so that no more than a
        chunk's logits exist (the GPU's: one storage binding's worth) and none is kept for the backward, which only
        scales these by the loss's gradient. A target outside [0, vocab) that is not ignore_index is
        cross_entropy_forward's error."""

    @reference_fallback
    def embedding_forward(self, weight, idx):
        """Rows of weight (num_embeddings, C) picked by the integer array idx -> idx.shape + (C,)."""

    @reference_fallback
    def embedding_backward(self, g, idx, num_embeddings: int):
        """Gradient of embedding_forward for the weight: g's rows added up per id -> (num_embeddings, C)."""

    @reference_fallback
    def embedding_with_positions_forward(self, wte, wpe, idx):
        """A GPT's input: token rows plus position rows, wte[idx] + wpe[:T] for ids idx (..., T), the positions
        0..T-1 along idx's last axis (T <= wpe's rows) -> idx.shape + (C,)."""

    @reference_fallback
    def embedding_with_positions_backward(self, g, idx, num_embeddings: int, num_positions: int):
        """Gradients (g_wte (num_embeddings, C), g_wpe (num_positions, C)) of embedding_with_positions_forward:
        g's rows added up per token id, and per position over the leading axes (rows T onwards zero)."""

    @reference_fallback
    def attention_forward(self, qkv, n_head: int, scale: float, for_backward=True):
        """Causal self-attention straight from the qkv projection's output -> (y, lse); lse None without
        for_backward.

        qkv (B, T, 3C) holds [q | k | v] along the last axis, head h in columns h*hs:(h+1)*hs of each part
        (hs = C / n_head). y (B, T, C) is softmax(scale * q @ k.T, causal) @ v per head, written where the
        output projection reads it; lse (B, n_head, T) is each row's logsumexp of the scaled scores, all the
        backward needs to recompute the probabilities (no T x T array is kept)."""

    @reference_fallback
    def attention_backward(self, g, qkv, y, lse, n_head: int, scale: float):
        """Gradient of (y, lse) = attention_forward(qkv, n_head, scale) for qkv, given y's gradient g (B, T, C)
        -> g_qkv (B, T, 3C), the probabilities recomputed from lse."""

    # --- optimizer ---
    @reference_fallback
    def global_norm(self, arrays: list):
        """The Euclidean norm of all the arrays together, as a scalar array (no host sync)."""

    @reference_fallback
    def global_norm_and_clip(self, arrays: list, max_norm: float):
        """(norm, coefficient): global_norm(arrays) and min(1, max_norm / (norm + 1e-6)), the factor that clips
        the gradients to max_norm, as scalar arrays from the same pass."""

    @reference_fallback
    def adamw_update_(self, params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, hyper, *,
                      beta1: float, beta2: float, eps: float, weight_decay: float | list, grad_scale=None):
        """AdamW in place on every parameter. hyper = [lr, 1 - beta1^t, 1 - beta2^t], the values that change
        every step, kept in an array so a captured step reads them; weight_decay one for all or one per
        parameter (groups that differ only in it are one update); grad_scale (a scalar array, or None)
        multiplies every gradient first (the clip coefficient)."""

    @reference_fallback
    def sgd_update_(self, params: list, grads: list, momentum_buffers: list, hyper, *, momentum: float,
                    weight_decay: float, grad_scale=None):
        """SGD with momentum in place on every parameter; hyper = [lr]."""

    # --- data parallel: every gradient in one buffer, so one Allreduce (and one read-back) moves them all ---
    @reference_fallback
    def pack(self, arrays: list):
        """Every array's elements laid end to end in one flat array (all arrays of one dtype)."""

    @reference_fallback
    def unpack(self, flat, shapes: list):
        """pack's inverse: a list of fresh arrays, one per shape, holding consecutive pieces of `flat`."""

    def reduce_on_host_(self, src, dst, host: np.ndarray, parts: list, in_thread: bool = False) -> None:
        """The flat array src read back into `host`, reduced there and written into dst (src's shape): each
        of `parts`, (start, stop, fn), has fn() reduce host[start:stop] in place. A GPU backend overlaps the
        parts' transfers with the fns, which then run in a thread of their own where in_thread (one at a
        time, in order; the data-parallel step's MPI sums)."""
        self.to_numpy(src, out=host)
        for _, _, fn in parts:
            fn()
        self.write_(dst, host)

    # --- generation: decoding with a KV cache. The sequence state lives in backend arrays (a ring of token
    # ids and its length), so a decode step reads no host value and a GPU backend can replay it. ---
    @reference_fallback
    def embed_window(self, wte, wpe, tokens, length, count: int):
        """The last `count` tokens of each sequence embedded -> (B, count, C): token ids from `tokens`
        (B, H), a ring holding token i of a sequence at slot i % H, whose length is length[0] (an int array
        (1,)); token rows of wte plus position rows of wpe, positions counted from the start of the last
        block_size tokens (block_size = wpe's rows), the window a GPT sees. count <= min(length, block_size)."""

    @reference_fallback
    def kv_cache_write_(self, k_cache, v_cache, qkv, length):
        """Store the keys and values of qkv (B, T, 3C), its second and third thirds, in k_cache and v_cache
        (B, block_size, C) as the window's last T positions: rows min(length, block_size) - T onwards."""

    @reference_fallback
    def attention_decode(self, qkv, k_cache, v_cache, length, n_head: int, scale: float):
        """Causal attention of one new position -> y (B, 1, C): its query, the first third of qkv (B, 1, 3C),
        over the first min(length, block_size) rows of the caches (B, block_size, C), per head."""

    @reference_fallback
    def sample_tokens_(self, logits, tokens, length, ids, *, temperature: float, top_k: int, seed: int):
        """Draw each sequence's next token from logits (B, V); write it into ids (B,) and into the ring
        `tokens` (B, H) at slot length % H. temperature 0 takes the first largest logit; otherwise
        p ~ exp((logit - max) / temperature) over the logits >= the top_k-th largest, and the token is the
        first whose running sum of p exceeds u * sum(p), u in [0, 1) a hash of (seed, sequence, length):
        the same seed gives the same draws on every run, with no generator state to carry."""

    @reference_fallback
    def advance_(self, length):
        """length[0] += 1: the sequences grew by the token just drawn."""

    # --- memory ---
    def memory_stats(self, reset_peak: bool = False) -> dict:
        """Memory held for arrays, in bytes: `in_use_bytes` (arrays alive now), `pooled_bytes` (freed, kept
        for reuse) and `peak_bytes` (the most in use at once, since the start or since the last call with
        reset_peak, which restarts the peak from what is in use now). A backend reports None for what it
        cannot count: the NumPy backend keeps no pool (pooled 0) and leaves its arrays to NumPy's allocator
        without counting them (in use and peak None)."""
        return {"in_use_bytes": None, "pooled_bytes": 0, "peak_bytes": None}

    def empty_cache(self) -> None:
        """Give the memory of pooled (freed but kept) buffers back to the driver; arrays in use stay. The
        NumPy backend has no pool: nothing to do."""


def reference() -> Backend:
    from tinynn.numpy_backend import NUMPY
    return NUMPY


def _to_numpy(backend, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_to_numpy(backend, v) for v in x)
    return backend.to_numpy(x) if backend.is_array(x) else x


def _from_numpy(backend, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_from_numpy(backend, v) for v in x)
    # a 0-d operand's answer can be a NumPy scalar (int32 * 0.5: a float64): an array of the backend's too
    return backend.from_numpy(np.asarray(x)) if isinstance(x, (np.ndarray, np.generic)) else x


def _flatten(xs):
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flatten(x)
        else:
            yield x
