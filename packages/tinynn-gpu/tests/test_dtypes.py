"""Every dtype the GPU backend accepts gives NumPy's answer, values and dtype, for every op: float32 and int32 in
GPU buffers, bool and the other integer types through the NumPy reference (backend.py's module docstring);
float64 and int64 are the documented exceptions, stored as float32 and int32."""
import numpy as np
import pytest

import tinynn
from tinynn import backends

REF = backends.reference()
NARROW = [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.uint32, np.uint64]  # no kernel: NumPy's answers


def values(rng, dtype, shape):
    if dtype is np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -2**31), min(info.max, 2**31 - 1), shape, endpoint=True).astype(dtype)


def same(got, want):
    """got is want, as the GPU backend stores it: float64 as float32, int64 as int32 (values checked on the way)."""
    want = np.asarray(want)
    if want.dtype in (np.float64, np.int64):
        want = want.astype(np.float32 if want.dtype == np.float64 else np.int32)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(got, want)


def test_uint8_and_bool_arithmetic_is_numpys(poisoned):
    a = tinynn.tensor(np.array([200, 100], np.uint8), backend=poisoned)
    same((a + a).numpy(), np.array([144, 200], np.uint8))
    b = tinynn.tensor(np.array([True, False]), backend=poisoned)
    same((b + b).numpy(), np.array([True, False]))
    same((b * b).numpy(), np.array([True, False]))


@pytest.mark.parametrize("dtype", NARROW, ids=lambda d: np.dtype(d).name)
def test_every_op_on_narrow_integers_and_bools_is_numpys(poisoned, dtype, rng):
    x, y = values(rng, dtype, (3, 4)), values(rng, dtype, (4,))
    gx, gy = poisoned.from_numpy(x), poisoned.from_numpy(y)
    same(poisoned.to_numpy(gx), x)
    for op in ("add", "sub", "mul", "eq"):
        if dtype is np.bool_ and op == "sub":
            continue  # NumPy refuses bool subtraction
        same(poisoned.to_numpy(poisoned.binary(op, gx, gy)), REF.binary(op, x, y))
    same(poisoned.to_numpy(poisoned.binary("add", gx, poisoned.from_numpy(y.astype(np.float32)))),
         REF.binary("add", x, y.astype(np.float32)))  # mixed with float32: NumPy's promotion
    for op, s in (("add", 3), ("mul", 7)):
        same(poisoned.to_numpy(poisoned.scalar(op, gx, s)), REF.scalar(op, x, s))
    if dtype is not np.bool_:
        same(poisoned.to_numpy(poisoned.unary("relu", gx)), REF.unary("relu", x))
    for axes in ((0,), (0, 1)):
        same(poisoned.to_numpy(poisoned.sum(gx, axes)), REF.sum(x, axes))
        same(poisoned.to_numpy(poisoned.max(gx, axes)), REF.max(x, axes))
    same(poisoned.to_numpy(poisoned.permute(gx, (1, 0))), REF.permute(x, (1, 0)))
    same(poisoned.to_numpy(poisoned.broadcast_to(gy, (2, 4))), REF.broadcast_to(y, (2, 4)))
    same(poisoned.to_numpy(poisoned.getitem(gx, (slice(None, None, -1), 1))), x[::-1, 1])
    same(poisoned.to_numpy(poisoned.concatenate([gx, gx], 0)), np.concatenate([x, x], 0))
    same(poisoned.to_numpy(poisoned.reshape(gx, (4, 3))), x.reshape(4, 3))
    same(poisoned.to_numpy(poisoned.full((2, 3), 1, dtype)), np.full((2, 3), 1, dtype))


def test_a_step_with_a_bool_array_runs_eagerly_and_says_why(poisoned):
    mask = poisoned.from_numpy(np.array([True, False, True]))
    x = poisoned.from_numpy(np.ones(3, np.float32))
    step = poisoned.capture(lambda: tinynn.Tensor(poisoned.binary("mul", x, mask), poisoned))
    for _ in range(5):
        got = step()
    same(got.numpy(), np.array([1.0, 0.0, 1.0], np.float32))
    assert step.eager_reason == "binary ran on the CPU (no bool kernel)"


SLICES = [(slice(None, None, -1),), (slice(None), slice(None, None, -2)), (slice(4, 0, -3), slice(1, None, -1)),
          (Ellipsis, slice(-1, -5, -1)), (slice(None, None, -1), None, 2), (slice(2, None, -2), slice(None, None, 3))]


@pytest.mark.parametrize("index", SLICES, ids=repr)
def test_negative_steps_slice_as_numpy_does(poisoned, index, rng):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    got = poisoned.to_numpy(poisoned.getitem(poisoned.from_numpy(x), index))
    same(got, x[index])
    g = rng.standard_normal(x[index].shape).astype(np.float32)
    got = poisoned.to_numpy(poisoned.getitem_backward(poisoned.from_numpy(g), index, x.shape))
    same(got, REF.getitem_backward(g, index, x.shape))
    ints = values(rng, np.int32, (6, 5))
    same(poisoned.to_numpy(poisoned.getitem(poisoned.from_numpy(ints), index)), ints[index])


def test_reversed_tensor_gradient(poisoned, rng):
    x = rng.standard_normal((4, 3)).astype(np.float32)
    t = tinynn.tensor(x, requires_grad=True, backend=poisoned)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    (t[::-1, ::-2] * tinynn.tensor(w[:, ::2], backend=poisoned)).sum().backward()
    want = np.zeros_like(x)
    want[::-1, ::-2] = w[:, ::2]
    same(t.grad.numpy(), want)


def test_int32_mean(poisoned):
    x = np.array([[1, 2, 4], [7, 9, 11]], np.int32)
    t = tinynn.tensor(x, backend=poisoned)
    for axis in (None, 0, 1):
        got = t.mean(axis).numpy()
        assert got.dtype == np.float32  # NumPy's float64, stored as the GPU stores floats
        np.testing.assert_allclose(got, x.mean(axis), rtol=1e-7)
