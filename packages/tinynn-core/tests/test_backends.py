"""The backend interface: every op has a NumPy reference of its signature, and a backend without an op of its
own falls back to that reference."""
import inspect

import numpy as np

from tinynn import backends


def test_every_op_has_a_reference_with_the_interface_signature():
    """The NumPy backend implements every op itself (its fallback would call itself), with the parameter
    names the interface documents, so a backend written from the interface fits the reference."""
    ops = backends.Backend.ops()
    assert {"matmul", "layernorm_backward", "adamw_update_"} <= set(ops)
    for name in ops:
        ref = getattr(type(backends.reference()), name)
        assert not getattr(ref, "is_op", False), f"the NumPy backend lacks its own {name}"
        declared = inspect.signature(getattr(backends.Backend, name))
        assert list(inspect.signature(ref).parameters) == list(declared.parameters), name


def test_an_inplace_fallback_writes_the_reference_results_back():
    from fake_backends import FakeGpu

    class NoSgd(FakeGpu):
        sgd_update_ = backends.Backend.sgd_update_
    gpu = NoSgd()
    p, g, buf = (gpu.from_numpy(np.full(3, v)) for v in (1.0, 0.5, 0.0))
    gpu.sgd_update_([p], [g], [buf], gpu.from_numpy(np.array([0.1])), momentum=0.0, weight_decay=0.0)
    np.testing.assert_allclose(gpu.to_numpy(p), np.full(3, 0.95))
    assert gpu.fallbacks["sgd_update_"] == 1


class _Box:
    """An array only its backend can read, as a GPU's is."""
    def __init__(self, value):
        self.value = value
        self.shape, self.dtype, self.ndim, self.size = value.shape, value.dtype, value.ndim, value.size


class _BoxedBackend(backends.Backend):
    """Every op the reference's: arrays cross to NumPy through the fallback alone."""
    def from_numpy(self, a):
        return _Box(np.array(a))

    def to_numpy(self, x):
        return x.value.copy()

    def is_array(self, x):
        return isinstance(x, _Box)

    def write_(self, dst, src):
        dst.value[...] = src


def test_a_fallback_moves_the_arrays_passed_by_keyword_too():
    """functional.py passes an MLP's x_pre by keyword: the fallback must give the reference its NumPy copy (a GPU
    array too large for one binding reached the reference as it was: a TypeError traceback)."""
    rng = np.random.default_rng(0)
    g, x, w, x_pre = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (4, 5), (3, 5), (4, 5)))
    be = _BoxedBackend()
    got = be.linear_backward(be.from_numpy(g), be.from_numpy(x), be.from_numpy(w), x_activation="gelu",
                             x_pre=be.from_numpy(x_pre))
    want = backends.reference().linear_backward(g, x, w, x_activation="gelu", x_pre=x_pre)
    for a, b in zip(got, want):
        np.testing.assert_allclose(be.to_numpy(a), b, rtol=1e-6)
    assert be.fallbacks["linear_backward"] == 1
