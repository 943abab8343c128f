"""The tensor-core attention's first-use check: before "high" attention first runs on tensor cores, every tile
this device would use runs one small case, the forward and then the backward, against NumPy's float64 answer.
The matmuls' check (matmul/tensor.py's `tensor_cores`) proves the device's subgroup matrices multiply; this one
proves the attention kernels' own staging, layouts and stores on them, so that a driver these kernels have never
met gives the float32 kernels' answers, not wrong ones. Wrong kernels are off by O(1); f16 leaves ~1e-3.
"""
from __future__ import annotations

import numpy as np

from tinynn import backends
from tinynn_gpu.ops import attention_tensor, attention_tensor_backward

BATCH, SEQ, N_HEAD = 1, 40, 2  # T off the tiles' grid: the masked last block runs too
HEAD_SIZES = (64, 128, 48, 32, 16)  # a tile is checked at the first of these it takes here
RTOL = 1e-2  # y's, each gradient's relative error; the logsumexp's absolute


def head_size_for(tile, max_bytes: int, half_bytes: int) -> int | None:
    return next((hs for hs in HEAD_SIZES if not tile.check(hs, max_bytes, half_bytes)), None)


def error(got, want) -> float:
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def check(forward, backward) -> str:
    """Why the tensor-core kernels (a TensorAttention, a TensorBackward) must not run here, or "": each tile of
    theirs that fits this device, on a case it takes. A compile or pipeline error is a reason too."""
    rt, ref = forward.rt, backends.reference()
    half = 2 if forward.f16 else 4
    rng = np.random.default_rng(0)
    try:
        for tile in attention_tensor.TENSOR_TILES:
            head_size = head_size_for(tile, forward.max_bytes, half)
            if head_size is None:
                continue
            qkv = rng.standard_normal((BATCH, SEQ, 3 * N_HEAD * head_size)).astype(np.float32)
            scale = head_size ** -0.5
            y, lse = rt.empty((BATCH, SEQ, N_HEAD * head_size)), rt.empty((BATCH, N_HEAD, SEQ))
            forward.forward(rt.upload(qkv), y, lse, N_HEAD, scale, tile)
            y_ref, lse_ref = ref.attention_forward(qkv.astype(np.float64), N_HEAD, scale)
            y_err, lse_err = error(rt.read(y), y_ref), float(np.abs(rt.read(lse) - lse_ref).max())
            if not (y_err <= RTOL and lse_err <= RTOL):  # NaN fails too
                return f"the tensor-core attention forward (tile {tile}, head size {head_size}) gave a wrong " \
                       f"test answer (y's relative error {y_err:.1e}, the logsumexp's {lse_err:.1e})"
        for tile in attention_tensor_backward.BACKWARD_TENSOR_TILES:
            head_size = head_size_for(tile, backward.max_bytes, half)
            if head_size is None:
                continue
            qkv = rng.standard_normal((BATCH, SEQ, 3 * N_HEAD * head_size))
            grad = rng.standard_normal((BATCH, SEQ, N_HEAD * head_size))
            scale = head_size ** -0.5
            y_ref, lse_ref = ref.attention_forward(qkv, N_HEAD, scale)
            g_ref = ref.attention_backward(grad, qkv, y_ref, lse_ref, N_HEAD, scale)
            g_qkv = rt.empty(qkv.shape)
            arrays = (rt.upload(x.astype(np.float32)) for x in (grad, qkv, y_ref, lse_ref))
            backward.backward(*arrays, g_qkv, N_HEAD, scale, tile)
            got, want = (x.reshape(BATCH, SEQ, 3, -1) for x in (rt.read(g_qkv), g_ref))
            errors = [error(got[:, :, i], want[:, :, i]) for i in range(3)]
            if not all(e <= RTOL for e in errors):
                return f"the tensor-core attention backward (tile {tile}, head size {head_size}) gave a wrong " \
                       f"test answer (dq's, dk's, dv's relative errors {', '.join(f'{e:.1e}' for e in errors)})"
    except Exception as e:  # a compile or pipeline error: subgroup matrices, but not as these kernels use them
        return f"the tensor-core attention failed its test case ({type(e).__name__}: {e})"
    return ""
