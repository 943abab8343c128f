"""Tensor under Python's and NumPy's protocols, as PyTorch and NumPy users write it: `==` and `!=` elementwise
while identity stays the hash, `bool()`, `len()` and iteration, `np.asarray`, `.T` and `repr`; each matches
NumPy's answer or is refused with an error that says why. Run once per backend."""
import numpy as np
import pytest

import tinynn


def shape(rng, ndim, low=1, high=5):
    return tuple(int(n) for n in rng.integers(low, high + 1, size=ndim))


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_eq_and_ne_are_elementwise(backend, rng, dtype):
    a = rng.integers(0, 3, shape(rng, 2)).astype(dtype)
    b = rng.integers(0, 3, a.shape[1:]).astype(dtype)  # broadcast along the first axis
    ta, tb = tinynn.tensor(a, backend=backend), tinynn.tensor(b, backend=backend)
    np.testing.assert_array_equal((ta == tb).numpy(), a == b)
    np.testing.assert_array_equal((ta != tb).numpy(), a != b)
    np.testing.assert_array_equal((ta == 1).numpy(), a == 1)
    np.testing.assert_array_equal((1 == ta).numpy(), 1 == a)
    np.testing.assert_array_equal((b == ta).numpy(), b == a)  # an ndarray on the left defers to the tensor
    assert (ta == tb).dtype.kind == np.dtype(dtype).kind
    if dtype == np.float32:  # (an int32 tensor's mean fails on the GPU backend, == or not: a fallback's 0-d result)
        assert (ta == tb).mean().item() == pytest.approx((a == b).mean())  # an accuracy, the PyTorch habit
    assert not (tinynn.tensor(a, requires_grad=True, backend=backend) == tb).requires_grad


def test_eq_with_a_number_follows_numpys_promotion(backend):
    ints, floats = tinynn.tensor([0, 1], backend=backend), tinynn.tensor([0.1, 1.0], backend=backend)
    np.testing.assert_array_equal((ints == 0.5).numpy(), [0, 0])  # 0.5 is not cast to the int 0
    np.testing.assert_array_equal((ints == 1.0).numpy(), [0, 1])
    np.testing.assert_array_equal((floats == 0.1).numpy(), [1, 0])  # a Python float takes float32, as in NumPy
    assert (floats == None) is False and (floats != "x") is True  # noqa: E711  not numbers: Python's identity


def test_identity_is_the_hash_and_is(backend):
    a, b = tinynn.tensor([1.0, 2.0], backend=backend), tinynn.tensor([1.0, 2.0], backend=backend)
    assert {a: "a", b: "b"}[b] == "b" and len({a, b, a}) == 2
    assert a in [a] and a is not b


def test_bool_is_a_single_values_truth(backend):
    assert bool(tinynn.tensor([0.0], backend=backend)) is False
    assert bool(tinynn.tensor(0.5, backend=backend)) is True
    assert bool(tinynn.tensor([[0]], backend=backend)) is False
    for values in ([1.0, 2.0], np.zeros((0,))):
        with pytest.raises(RuntimeError, match="ambiguous"):
            bool(tinynn.tensor(values, backend=backend))
    assert float(tinynn.tensor([2.5], backend=backend)) == 2.5 and int(tinynn.tensor(3, backend=backend)) == 3


def test_len_and_iteration_need_a_dimension(backend, rng):
    a = rng.standard_normal(shape(rng, 2)).astype(np.float32)
    t = tinynn.tensor(a, backend=backend)
    assert len(t) == a.shape[0]
    np.testing.assert_array_equal(np.stack([row.numpy() for row in t]), a)
    scalar = tinynn.tensor(1.0, backend=backend)
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(scalar)
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        iter(scalar)


def test_asarray_gives_the_values_and_a_ufunc_is_refused(backend, rng):
    a = rng.standard_normal(shape(rng, 3)).astype(np.float32)
    t = tinynn.tensor(a, requires_grad=True, backend=backend)
    got = np.asarray(t)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, a)
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    with pytest.raises(TypeError, match="ufunc"):  # np.exp(t) would be a host array outside the graph
        np.exp(t)
    assert isinstance(np.float32(2.0) * t, tinynn.Tensor) and isinstance(a + t, tinynn.Tensor)


def test_T_reverses_the_axes_as_numpy(backend, rng):
    for ndim in range(5):
        a = rng.standard_normal(shape(rng, ndim)).astype(np.float32)
        t = tinynn.tensor(a, requires_grad=True, backend=backend)
        np.testing.assert_array_equal(t.T.numpy(), a.T)
    t = tinynn.tensor(rng.standard_normal((2, 3, 4)), requires_grad=True, backend=backend)
    (t.T * tinynn.tensor(np.arange(24.0).reshape(4, 3, 2), backend=backend)).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), np.arange(24.0).reshape(4, 3, 2).T)


def test_repr_shows_the_values(backend):
    t = tinynn.tensor([[1.5, -2.0], [3.0, 4.25]], requires_grad=True, backend=backend)
    text = repr(t)
    assert text.startswith("tensor([[ 1.5 , -2.  ],") and "4.25" in text
    assert f"shape=(2, 2), dtype=float32, backend={backend.name}, requires_grad=True)" in text
    assert str(tinynn.tensor(7, backend=backend)).startswith("tensor(7, shape=()")
