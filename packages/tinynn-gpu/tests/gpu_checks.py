"""Checks the GPU tests share: the relative error against the NumPy reference (NaN-poisoned outputs fail it), a
float64 matmul reference, and the kernels a call dispatches."""
import numpy as np


def rel_err(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    assert np.isfinite(actual).all(), "unwritten (NaN) or non-finite elements"
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30))


def reference(a, b, ta, tb):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.matmul(a.swapaxes(-1, -2) if ta else a, b.swapaxes(-1, -2) if tb else b)


def dispatches(gpu, fn):
    """fn()'s result and how many kernels it dispatched (the poisoning fills not counted)."""
    entries, plain = [], gpu.rt.launch

    def counted(launch, arrays):  # every dispatch, prepared afresh or kept, is launched
        if launch is not None:
            entries.append(launch.entry)
        return plain(launch, arrays)
    gpu.rt.launch = counted
    try:
        result = fn()
    finally:
        del gpu.rt.launch
    return result, sum(entry != "fill_main" for entry in entries)
