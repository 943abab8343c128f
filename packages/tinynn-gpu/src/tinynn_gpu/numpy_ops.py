"""The lesson's NumPy-in, NumPy-out entries (its `matmul_data()`): the GPU when tinynn's GPU backend is
usable, the CPU otherwise or when an input exceeds the GPU's binding limit. Results match either way.

    >>> from tinynn_gpu import matmul_data
    >>> c = matmul_data(a, b)   # a (B, M, K) or (M, K), b (B, K, N) or (K, N)

scale, add and relu run the lesson module's own entries (lesson.wgsl, with its 16-byte `Params`);
matmul_data runs the backend's matmul, which picks the fastest variant (matmul/selection.py).
"""
from __future__ import annotations

import numpy as np

from tinynn import registry
from tinynn_gpu.runtime.arrays import TooLarge


def _gpu():
    status = registry.load("gpu")
    return status.backend


def _on_gpu(gpu_fn, cpu_fn, *arrays):
    gpu = _gpu()
    if gpu is not None:
        try:
            return gpu_fn(gpu, *[gpu.rt.upload(np.ascontiguousarray(a, dtype=np.float32)) for a in arrays])
        except TooLarge:
            pass
    return cpu_fn(*arrays)


def _elementwise(gpu, entry, a, b=None, scalar_bits=0):
    lesson = gpu.mm.variant("lesson16")
    out = gpu.rt.empty(a.shape)
    bindings = {"a": a, "out": out} if b is None else {"a": a, "b": b, "out": out}
    gpu.rt.dispatch(lesson.module, entry, -(-a.size // 256), bindings, {"p0": a.size, "p1": scalar_bits})
    return gpu.rt.read(out)


def matmul_data(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """out[B,M,N] = a[B,M,K] @ b[B,K,N] (2-D inputs too), float32."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul_data: inner dimensions differ: {a.shape} @ {b.shape}")
    return _on_gpu(lambda gpu, x, y: gpu.rt.read(gpu.matmul(x, y)), np.matmul, a, b)


def scale_data(a: np.ndarray, s: float) -> np.ndarray:
    bits = int(np.float32(s).view(np.uint32))
    return _on_gpu(lambda gpu, x: _elementwise(gpu, "scale_main", x, scalar_bits=bits),
                   lambda x: (x * np.float32(s)).astype(np.float32), np.asarray(a, np.float32))


def add_data(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape:
        raise ValueError(f"add_data: shapes differ: {a.shape} and {b.shape}")
    return _on_gpu(lambda gpu, x, y: _elementwise(gpu, "add_main", x, y), np.add, a, b)


def relu_data(a: np.ndarray) -> np.ndarray:
    return _on_gpu(lambda gpu, x: _elementwise(gpu, "relu_main", x), lambda x: np.maximum(x, 0),
                   np.asarray(a, np.float32))
