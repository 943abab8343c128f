"""The tensor-core matmul of matmul precision "high" (matmul/tensor.py) against float64 NumPy, outputs poisoned
with NaN. On an adapter with f16 subgroup matrices (an NVIDIA GPU on Dawn) every configuration runs, within f16's
rounding; elsewhere (lavapipe) "high" runs as "highest", and these tests check that it says so and stays exact.
The scales pass needs no tensor cores and runs everywhere."""
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from test_blocked import assert_matmul_result, epilogue_for, matmul_cases, operands
from tinynn import precision
from tinynn.errors import TinynnNotice
from tinynn_gpu.matmul.configs import TENSOR_CONFIGS, TensorConfig
from tinynn_gpu.matmul.tensor import scales_launch

HIGH_RTOL = 1e-3  # f16's 10-bit mantissa (TF32's), relative to the size of the terms


@pytest.fixture
def high(poisoned):
    """The poisoned backend with matmul precision "high" for the test."""
    precision.set_matmul_precision("high")
    yield poisoned
    precision.set_matmul_precision(None)


def expected_scales(x):
    """2^(15 - e) for each line's largest magnitude in [2^(e-1), 2^e) (1 for a line of zeros)."""
    amax = np.abs(x).max(axis=-1)
    _, e = np.frexp(amax)
    return np.where(amax == 0, 1.0, np.ldexp(1.0, np.clip(15 - e, -126, 126)))


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("batch, shared, k", [(1, True, 1100), (3, False, 1100), (2, True, 53)])
def test_scales_pass(poisoned, rng, ta, tb, batch, shared, k):
    """Every row of op(a) and column of op(b) gets the power of two that puts its largest magnitude in
    [2^14, 2^15), lines spanning 1e-30 to 1e30 and a line of zeros included; op(a)'s row sums come with them."""
    gpu, m, n = poisoned, 37, 70  # k = 1100: several chunks of a line in either layout
    a = rng.standard_normal((batch, m, k)) * 10.0 ** rng.integers(-30, 30, (batch, m, 1))
    b = rng.standard_normal((1 if shared else batch, k, n)) * 10.0 ** rng.integers(-30, 30, (1, 1, n))
    a[0, 5], b[0, :, 7] = 0.0, 0.0
    a, b = a.astype(np.float32), b.astype(np.float32)
    stored_a = a.swapaxes(-1, -2) if ta else a
    stored_b = b.swapaxes(-1, -2) if tb else b
    stored_b = stored_b[0] if shared else stored_b
    a_scales, b_scales, sums = gpu.rt.empty((batch * m,)), gpu.rt.empty(((1 if shared else batch) * n,)), \
        gpu.rt.empty((batch * m,))
    record = scales_launch(gpu.rt, batch, m, n, k, ta, tb, shared, True)
    record(gpu.from_numpy(np.ascontiguousarray(stored_a)), gpu.from_numpy(np.ascontiguousarray(stored_b)),
           a_scales, b_scales, sums)
    np.testing.assert_array_equal(gpu.to_numpy(a_scales), expected_scales(a).ravel())
    np.testing.assert_array_equal(gpu.to_numpy(b_scales), expected_scales(b.swapaxes(-1, -2)).ravel())
    want = a.astype(np.float64).sum(-1).ravel()
    np.testing.assert_allclose(gpu.to_numpy(sums), want, rtol=1e-5, atol=1e-5 * np.abs(a).sum(-1).ravel().max())


def test_scales_at_the_edges_of_float32(poisoned):
    """A line as large as float32 goes gets its scale like any other (f16 would overflow at scale 1); a line of
    infinities or NaNs gets 1, and so does every line of an empty K, whose row sums are 0."""
    gpu, k = poisoned, 8
    big = np.finfo(np.float32).max
    a = np.ones((4, k), np.float32)
    a[0, 3], a[1, 5], a[2], a[3] = 3.2e38, big, np.inf, np.nan
    b = np.ones((k, 4), np.float32)
    a_scales, b_scales, sums = gpu.rt.empty((4,)), gpu.rt.empty((4,)), gpu.rt.empty((4,))
    scales_launch(gpu.rt, 1, 4, 4, k, False, False, False, True)(gpu.from_numpy(a), gpu.from_numpy(b), a_scales,
                                                                  b_scales, sums)
    np.testing.assert_array_equal(gpu.to_numpy(a_scales), [2.0 ** -113, 2.0 ** -113, 1.0, 1.0])
    a_scales, b_scales, sums = gpu.rt.empty((4,)), gpu.rt.empty((4,)), gpu.rt.empty((4,))
    empty_a, empty_b = gpu.from_numpy(np.ones((4, 0), np.float32)), gpu.from_numpy(np.ones((0, 4), np.float32))
    scales_launch(gpu.rt, 1, 4, 4, 0, False, False, False, True)(empty_a, empty_b, a_scales, b_scales, sums)
    np.testing.assert_array_equal(np.concatenate([gpu.to_numpy(x) for x in (a_scales, b_scales, sums)]),
                                  [1.0] * 8 + [0.0] * 4)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=matmul_cases)
def test_high_matmul(high, case):
    """Any shape and layout in "high", epilogues included: within f16's rounding (exact where "high" runs as
    "highest")."""
    batch, m, n, k, ta, tb, shared, _ = case
    gpu = high
    a, b = operands(case)
    epilogue, expected = epilogue_for(case, gpu)
    da, db = gpu.from_numpy(a), gpu.from_numpy(b)
    out = gpu._matmul(da, db, ta, tb, epilogue)
    assert_matmul_result(gpu, out, epilogue, expected, a, b, ta, tb, HIGH_RTOL)


def test_tensor_config_names():
    """The table is written in the names tuning prints; each names one configuration, and a bad name is refused."""
    assert [TensorConfig.named(c.name) for c in TENSOR_CONFIGS] == list(TENSOR_CONFIGS)
    assert TensorConfig.named("64x64x32/2x2 split4 db") == TensorConfig(64, 64, 32, 2, 2, double=True, splits=4)
    with pytest.raises(ValueError, match="'64x64/2x2' is not a tensor-core matmul configuration"):
        TensorConfig.named("64x64/2x2")


def test_every_tensor_config(high):
    """Each tensor-core configuration on every layout, aligned and ragged shapes, batched and shared, each
    epilogue, where the device has tensor cores; elsewhere "high" is refused with its reason, once."""
    gpu = high
    usable, why = gpu.mm.tensor_cores()
    if not usable:
        assert why and gpu.matmul_precision() == ("highest", why)
        gpu.mm.said_why = False
        with pytest.warns(TinynnNotice, match="runs as 'highest'"):
            gpu.matmul(gpu.from_numpy(np.ones((4, 4), np.float32)), gpu.from_numpy(np.ones((4, 4), np.float32)))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once only
            gpu.matmul(gpu.from_numpy(np.ones((4, 8), np.float32)), gpu.from_numpy(np.ones((8, 4), np.float32)))
        return
    assert gpu.matmul_precision()[0] == "high"
    # (batch, m, n, k, b shared): aligned, ragged and batched (b shared or its own), N not a multiple of 4 where
    # b is stored transposed (its vec4s run along k), a long K
    shapes = ((1, 256, 128, 512, True), (2, 100, 36, 72, True), (2, 100, 37, 72, False), (1, 64, 300, 2048, True))
    for config in TENSOR_CONFIGS:
        variant = gpu.mm.variant(config.name)
        for i, (batch, m, n, k, shared) in enumerate(shapes):
            for j, (ta, tb) in enumerate(((False, False), (False, True), (True, False), (True, True))):
                if not TensorConfig.uses_vec4(m, n, k, ta, tb):
                    continue
                case = (batch, m, n, k, ta, tb, shared, 31 * i + 7 * j + len(config.name))
                a, b = operands(case)
                epilogue, expected = epilogue_for(case, gpu)
                out = gpu.rt.empty((batch, m, n))
                variant.record(gpu.from_numpy(a), gpu.from_numpy(b), out, batch, m, n, k, ta, tb, case[6], epilogue)
                assert_matmul_result(gpu, out, epilogue, expected, a, b, ta, tb, HIGH_RTOL)


@pytest.mark.parametrize("scale_a, scale_b", [(1e-6, 1e-6), (3e4, 3e4), (1e-6, 3e4), (1e-20, 1e-8), (1e20, 1e-20)])
def test_high_keeps_the_range(high, rng, scale_a, scale_b):
    """Operands far outside f16's range (6e-8 to 65504) neither flush to zero nor overflow: a backward's tiny
    gradients and large activations keep f16's relative precision."""
    gpu = high
    a = (rng.standard_normal((256, 512)) * scale_a).astype(np.float32)
    b = (rng.standard_normal((512, 128)) * scale_b).astype(np.float32)
    got = gpu.to_numpy(gpu.matmul(gpu.from_numpy(a), gpu.from_numpy(b)))
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - want) <= HIGH_RTOL * np.linalg.norm(want)
