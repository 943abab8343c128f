"""The few-row matmul (matmul/rows.py, rows.wgsl) against float64 NumPy, outputs poisoned with NaN: the matmuls
of a decode step, up to 16 rows times a weight stored (N, K), with the linear layer's epilogue; and the shapes
and epilogues the selector must leave to the tiled kernels."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinynn import backends
from tinynn_gpu.matmul.problem import Epilogue
from tinynn_gpu.matmul.rows import RowsMatmul

SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def assert_close(actual, expected, rtol=1e-5):
    assert actual.shape == expected.shape and np.isfinite(actual).all(), "unwritten (NaN) elements"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(1.0, float(np.abs(expected).max())))


@SETTINGS
@given(m=st.integers(1, 16), n=st.one_of(st.integers(1, 20), st.integers(90, 300)),
       k=st.one_of(st.integers(1, 10), st.integers(62, 275)).map(lambda v: 4 * v), with_bias=st.booleans(),
       seed=st.integers(0, 2**31))
def test_matmul_rows(poisoned, m, n, k, with_bias, seed):
    """Decoding's matmul (rows.wgsl), which the selector takes for up to 16 rows times a weight, K a
    multiple of 4: below, at and past one vec4 per thread (K = 256)."""
    g = np.random.default_rng(seed)
    a, w, bias = g.standard_normal((m, k)), g.standard_normal((n, k)), g.standard_normal(n)
    da, dw, dbias = (poisoned.from_numpy(x.astype(np.float32)) for x in (a, w, bias))
    out, _ = poisoned.linear_forward(da, dw, dbias if with_bias else None)
    assert poisoned.mm.last == poisoned.mm.rows.describe()
    assert_close(poisoned.to_numpy(out), a @ w.T + (bias if with_bias else 0), rtol=2e-5)


@SETTINGS
@given(m=st.integers(1, 16), n=st.integers(1, 300), k=st.integers(1, 75).map(lambda v: 4 * v),
       seed=st.integers(0, 2**31))
def test_matmul_rows_takes_the_whole_linear_epilogue(poisoned, m, n, k, seed):
    """A decode step's MLP: GELU (its input kept for the backward) and the residual add in the rows kernel."""
    g = np.random.default_rng(seed)
    x, w, bias, residual = g.standard_normal((m, k)), g.standard_normal((n, k)), g.standard_normal(n), \
        g.standard_normal((m, n))
    y, pre = poisoned.linear_forward(*(poisoned.from_numpy(v.astype(np.float32)) for v in (x, w, bias, residual)),
                                     activation="gelu")
    assert poisoned.mm.last == poisoned.mm.rows.describe()
    want_pre = x @ w.T + bias
    assert_close(poisoned.to_numpy(pre), want_pre, rtol=2e-5)
    assert_close(poisoned.to_numpy(y), backends.reference().unary("gelu", want_pre) + residual, rtol=2e-5)


def test_matmul_rows_leaves_a_k_not_a_multiple_of_4_to_the_tiled_kernels(poisoned):
    g = np.random.default_rng(0)
    a, w = g.standard_normal((3, 7)), g.standard_normal((5, 7))
    out, _ = poisoned.linear_forward(*(poisoned.from_numpy(x.astype(np.float32)) for x in (a, w)))
    assert poisoned.mm.last != poisoned.mm.rows.describe()
    assert_close(poisoned.to_numpy(out), a @ w.T)


def test_matmul_rows_leaves_gelus_gradient_to_the_tiled_kernels(poisoned):
    """A few rows times a transposed weight whose product is a GELU output's gradient: the rows kernel has
    no such epilogue, so the selector must not send it there."""
    g = np.random.default_rng(1)
    a, w, pre = g.standard_normal((3, 8)), g.standard_normal((5, 8)), g.standard_normal((3, 5))
    da, dw, dpre = (poisoned.from_numpy(x.astype(np.float32)) for x in (a, w, pre))
    out = poisoned._matmul(da, dw, False, True, Epilogue(activation_grad="gelu", pre=dpre))
    assert poisoned.mm.last != poisoned.mm.rows.describe()
    assert_close(poisoned.to_numpy(out), backends.reference().unary_backward("gelu", pre, None, a @ w.T))


def test_matmul_rows_is_not_used_where_its_workgroup_memory_is_not_offered(gpu, monkeypatch):
    monkeypatch.setitem(gpu.rt.ctx.limits, "max-compute-workgroup-storage-size", 16384)
    assert not RowsMatmul(gpu.rt).fits(1, 1, 256, False, True, Epilogue())
    monkeypatch.setitem(gpu.rt.ctx.limits, "max-compute-workgroup-storage-size", 32768)
    assert RowsMatmul(gpu.rt).fits(1, 1, 256, False, True, Epilogue())
