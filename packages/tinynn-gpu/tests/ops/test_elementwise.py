"""Elementwise kernels (ops/elementwise.py) past one dispatch dimension, against NumPy."""
import numpy as np


def test_elementwise_over_65535_workgroups(poisoned, rng):
    """More than 65535 * 256 elements need the 2-D dispatch grid."""
    x = rng.standard_normal(65535 * 256 + 1000).astype(np.float32)
    gpu = poisoned
    got = gpu.to_numpy(gpu.scalar("mul", gpu.from_numpy(x), 2.0))
    np.testing.assert_array_equal(got, x * 2)
