"""Sums and maxima (ops/reduce.py) against NumPy, in one dispatch whatever the axes, with subgroups and without."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_checks import dispatches, rel_err

RTOL = 1e-5
FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("shape,axes", [((3000, 7), (0,)), ((5, 100_000), (1,)), ((2, 3, 4, 5), (1, 3)),
                                        ((200_000,), (0,))])
def test_reductions_split_long_axes(poisoned, shape, axes, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    gpu = poisoned
    assert rel_err(gpu.to_numpy(gpu.sum(gpu.from_numpy(x), axes)), x.astype(np.float64).sum(axis=axes)) <= RTOL
    np.testing.assert_array_equal(gpu.to_numpy(gpu.max(gpu.from_numpy(x), axes)), x.max(axis=axes))


@FEW
@given(shape=st.lists(st.one_of(st.integers(1, 5), st.sampled_from([33, 257, 3000])), min_size=1, max_size=3)
       .filter(lambda shape: np.prod(shape) <= 100_000),  # small enough for lavapipe, and bound on the GPU
       pick=st.integers(0, 7), seed=st.integers(0, 2**31))
def test_reductions_in_one_dispatch(subgroup_path, shape, pick, seed):
    gpu = subgroup_path
    axes = tuple(i for i in range(len(shape)) if pick >> i & 1) or (len(shape) - 1,)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    got, count = dispatches(gpu, lambda: gpu.sum(gpu.from_numpy(x), axes))
    want, magnitude = x.astype(np.float64).sum(axis=axes), np.abs(x.astype(np.float64)).sum(axis=axes)
    # accuracy relative to the sum of |x|: a sum of signed values may cancel to almost nothing
    assert np.linalg.norm(gpu.to_numpy(got) - want) <= RTOL * np.linalg.norm(magnitude)
    runs = sum(1 for i in axes if i - 1 not in axes)  # separate runs of adjacent axes: one dispatch each
    assert count == runs
    np.testing.assert_array_equal(gpu.to_numpy(gpu.max(gpu.from_numpy(x), axes)), x.max(axis=axes))


def test_max_lets_nan_win(subgroup_path):
    gpu = subgroup_path
    x = np.arange(600, dtype=np.float32).reshape(2, 300)
    x[1, 17] = np.nan
    for axes in ((1,), (0,)):
        np.testing.assert_array_equal(gpu.to_numpy(gpu.max(gpu.from_numpy(x), axes)), x.max(axis=axes))
