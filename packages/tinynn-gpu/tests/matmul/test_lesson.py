"""The lesson's tiled matmul (matmul/lesson.py) and the NumPy-in, NumPy-out entries built on its kernel file, against
NumPy, outputs poisoned."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from test_blocked import assert_matmul_result, epilogue_for, matmul_cases, matmul_err, operands, rel_err
from tinynn_gpu import add_data, matmul_data, relu_data, scale_data
from tinynn_gpu.matmul.configs import LESSON_TILES
from tinynn_gpu.matmul.lesson import LessonMatmul
from tinynn_gpu.matmul.selection import MatmulSelector

RTOL = 1e-5


@pytest.mark.parametrize("tile", LESSON_TILES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=matmul_cases)
def test_lesson_matmul_every_tile(poisoned, tile, case):
    batch, m, n, k, ta, tb, shared, _ = case
    gpu = poisoned
    kernel = LessonMatmul(gpu.rt, tile)
    a, b = operands(case)
    da, db, out = gpu.from_numpy(a), gpu.from_numpy(b), gpu.rt.empty((batch, m, n))  # held: buffers stay ours
    kernel.record(da, db, out, batch, m, n, k, ta, tb, shared)
    assert matmul_err(gpu.to_numpy(out), a, b, ta, tb) <= RTOL


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=matmul_cases)
def test_lesson_matmul_leaves_the_epilogue_to_the_backend(poisoned, case):
    """The lesson's kernel has no epilogue: the backend applies it with separate ops, to the same result."""
    batch, m, n, k, ta, tb, shared, _ = case
    gpu = poisoned
    a, b = operands(case)
    epilogue, expected = epilogue_for(case, gpu)
    selector, gpu.mm = gpu.mm, MatmulSelector(gpu.rt, autotune=False)
    gpu.mm.forced = "lesson16"
    try:
        out = gpu._matmul(gpu.from_numpy(a), gpu.from_numpy(b), ta, tb, epilogue)
    finally:
        gpu.mm = selector
    assert_matmul_result(gpu, out, epilogue, expected, a, b, ta, tb)


def test_lesson_entries_numpy_in_numpy_out(poisoned, rng):
    a, b = rng.standard_normal((3, 37, 20)).astype(np.float32), rng.standard_normal((3, 20, 9)).astype(np.float32)
    assert rel_err(matmul_data(a, b), a.astype(np.float64) @ b) <= RTOL
    assert rel_err(matmul_data(a[0], b[0]), a[0].astype(np.float64) @ b[0]) <= RTOL
    x, y = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    np.testing.assert_array_equal(relu_data(x), np.maximum(x, 0))
    assert rel_err(scale_data(x, -1.5), x * -1.5) <= RTOL
    assert rel_err(add_data(x, y), x.astype(np.float64) + y) <= RTOL
    with pytest.raises(ValueError, match="inner dimensions"):
        matmul_data(a, a)
