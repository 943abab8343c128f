"""The tensor-core attention's first-use check: before "high" attention first runs a head size on tensor cores, the
tiles that would run it (the forward's, and the backward's where one takes the head size) run one small case, the
forward and then the backward, against NumPy's float64 answer. The matmuls' check (matmul/tensor.py's
`tensor_cores`) proves the device's subgroup matrices multiply; this one proves the attention kernels' own staging,
layouts and stores on them, at the head size that runs (its matrices along the head, its padding, its strides), so
that a driver these kernels have never met gives the float32 kernels' answers, not wrong ones. Wrong kernels are
off by O(1); f16 leaves ~1e-3.
"""
from __future__ import annotations

import numpy as np

from tinynn import backends

BATCH, SEQ, N_HEAD = 1, 40, 2  # T off the tiles' grid: the masked last block runs too
RTOL = 1e-2  # y's, each gradient's relative error; the logsumexp's absolute


def error(got, want) -> float:
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def poisoned(rt, shape):
    """An output array of NaNs: an element the kernel fails to write fails the check, whatever the pool held."""
    return rt.upload(np.full(shape, np.nan, np.float32))


def check(forward, backward, head_size: int) -> str:
    """Why the tensor-core kernels (a TensorAttention, a TensorBackward) must not run `head_size` here, or "": the
    tiles of theirs that would run it, on a small case. A compile or pipeline error is a reason too."""
    rt, ref = forward.rt, backends.reference()
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((BATCH, SEQ, 3 * N_HEAD * head_size))
    grad = rng.standard_normal((BATCH, SEQ, N_HEAD * head_size))
    scale = head_size ** -0.5
    y_ref, lse_ref = ref.attention_forward(qkv, N_HEAD, scale)
    try:
        tile = forward.tile(head_size)
        if tile is not None:
            y, lse = poisoned(rt, (BATCH, SEQ, N_HEAD * head_size)), poisoned(rt, (BATCH, N_HEAD, SEQ))
            forward.forward(rt.upload(qkv.astype(np.float32)), y, lse, N_HEAD, scale, tile)
            y_err, lse_err = error(rt.read(y), y_ref), float(np.abs(rt.read(lse) - lse_ref).max())
            if not (y_err <= RTOL and lse_err <= RTOL):  # NaN fails too
                return f"the tensor-core attention forward (tile {tile}, head size {head_size}) gave a wrong " \
                       f"test answer (y's relative error {y_err:.1e}, the logsumexp's {lse_err:.1e})"
        tile = backward.tile(qkv.shape, N_HEAD)
        if tile is not None:
            g_ref = ref.attention_backward(grad, qkv, y_ref, lse_ref, N_HEAD, scale)
            g_qkv = poisoned(rt, qkv.shape)
            arrays = (rt.upload(x.astype(np.float32)) for x in (grad, qkv, y_ref, lse_ref))
            backward.backward(*arrays, g_qkv, N_HEAD, scale, tile)
            got, want = (x.reshape(BATCH, SEQ, 3, -1) for x in (rt.read(g_qkv), g_ref))
            errors = [error(got[:, :, i], want[:, :, i]) for i in range(3)]
            if not all(e <= RTOL for e in errors):
                return f"the tensor-core attention backward (tile {tile}, head size {head_size}) gave a wrong " \
                       f"test answer (dq's, dk's, dv's relative errors {', '.join(f'{e:.1e}' for e in errors)})"
    except Exception as e:  # a compile or pipeline error: subgroup matrices, but not as these kernels use them
        return f"the tensor-core attention failed its test case at head size {head_size} ({type(e).__name__}: {e})"
    return ""
