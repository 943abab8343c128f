"""Checks every test uses: an op against a reference, and a gradient against central finite differences."""
import numpy as np

import tinynn
from tinynn import backends


def assert_close(actual, expected, rtol, atol=0.0, what="value"):
    """Like np.testing.assert_allclose, but the message gives the max difference and the first mismatches."""
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    diff = np.abs(actual - expected)
    bad = ~(diff <= atol + rtol * np.abs(expected))  # also catches NaN
    if bad.any():
        where = np.argwhere(bad)[:5]
        firsts = ", ".join(f"{tuple(i)}: {actual[tuple(i)]:.6g} vs {expected[tuple(i)]:.6g}" for i in where)
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} differ; max abs diff {np.nanmax(diff):.3g}; "
                             f"first: {firsts}")


def relative_error(actual, expected) -> float:
    """Frobenius-norm relative error, the measure the kernel tests bound."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30))


def gradcheck(fn, *arrays, eps=1e-6, rtol=1e-5, atol=1e-7, seed=0):
    """Check the gradients of sum(fn(*tensors) * w) (w random) against central differences, in float64."""
    cpu = backends.reference()
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    out = fn(*[tinynn.tensor(a, backend=cpu) for a in arrays])
    weights = np.random.default_rng(seed).standard_normal(out.shape)

    def scalar(values):
        return float((fn(*[tinynn.tensor(v, backend=cpu) for v in values]).numpy() * weights).sum())

    tensors = [tinynn.tensor(a, requires_grad=True, backend=cpu) for a in arrays]
    (fn(*tensors) * tinynn.tensor(weights, backend=cpu)).sum().backward()
    for i, (a, t) in enumerate(zip(arrays, tensors)):
        numeric = np.zeros_like(a)
        for j in np.ndindex(a.shape):
            plus, minus = [x.copy() for x in arrays], [x.copy() for x in arrays]
            plus[i][j] += eps
            minus[i][j] -= eps
            numeric[j] = (scalar(plus) - scalar(minus)) / (2 * eps)
        assert t.grad is not None, f"input {i} got no gradient"
        assert_close(t.grad.numpy(), numeric, rtol=rtol, atol=atol, what=f"gradient of input {i}")
