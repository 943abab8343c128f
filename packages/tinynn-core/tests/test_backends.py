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
