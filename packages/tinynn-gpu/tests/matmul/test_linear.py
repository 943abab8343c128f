"""The backend's matmul and linear ops (matmul/linear.py) against float64 NumPy, outputs poisoned with NaN: linear
layers with their epilogues, on drawn edge shapes."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_blocked import matmul_cases, matmul_err, operands, rel_err
from tinynn import backends

from gpu_checks import dispatches

RTOL = 1e-5
dims = st.one_of(st.sampled_from([1, 2, 31, 32, 33, 255, 256, 257]), st.integers(1, 300))
REF = backends.reference()
FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=matmul_cases)
def test_backend_matmul(poisoned, case):
    batch, m, n, k, ta, tb, shared, _ = case
    gpu = poisoned
    a, b = operands(case)
    got = gpu.to_numpy(gpu.matmul(gpu.from_numpy(a), gpu.from_numpy(b), ta, tb))
    assert matmul_err(got, a, b, ta, tb) <= RTOL


@FEW
@given(n=dims, n_in=dims, n_out=dims, has_bias=st.booleans(), gelu=st.booleans(), has_residual=st.booleans(),
       x_gelu=st.booleans(), seed=st.integers(0, 2**31))
def test_linear_forward_and_backward(poisoned, n, n_in, n_out, has_bias, gelu, has_residual, x_gelu, seed):
    """rtol 1e-4: a drawn shape may be a single output whose terms cancel (float32 sums of ~n_in terms)."""
    gpu, g, rtol = poisoned, np.random.default_rng(seed), 1e-4
    x, w, dy = (g.standard_normal(s).astype(np.float32) for s in ((n, n_in), (n_out, n_in), (n, n_out)))
    # inputs of unit scale into GELU, as a network's are (test_backend_ops checks GELU itself out to 3e38)
    x /= np.float32(np.sqrt(n_in))
    bias = g.standard_normal(n_out).astype(np.float32) if has_bias else None
    residual = g.standard_normal((n, n_out)).astype(np.float32) if has_residual else None
    activation = "gelu" if gelu else None
    up = lambda a: None if a is None else gpu.from_numpy(a)  # noqa: E731
    f64 = lambda a: None if a is None else a.astype(np.float64)  # noqa: E731
    forward = lambda: gpu.linear_forward(up(x), up(w), up(bias), up(residual), activation)  # noqa: E731
    forward()  # a shape's first sight may autotune (every variant timed, where timestamps exist): count the next
    (y, pre), count = dispatches(gpu, forward)
    forward_kernel = gpu.mm.last
    want_y, want_pre = REF.linear_forward(f64(x), f64(w), f64(bias), f64(residual), activation)
    assert rel_err(gpu.to_numpy(y), want_y) <= rtol
    assert (pre is None) == (want_pre is None) and (pre is None or rel_err(gpu.to_numpy(pre), want_pre) <= rtol)
    # x_gelu: x is GELU(x_pre), the layer before's (an MLP's), its derivative applied in the g_x matmul
    x_activation, x_pre = ("gelu", (2 * x).astype(np.float32)) if x_gelu else (None, None)
    grads = gpu.linear_backward(up(dy), up(x), up(w), pre, activation, has_bias=has_bias, x_activation=x_activation,
                                x_pre=up(x_pre))
    for ours, theirs in zip(grads, REF.linear_backward(f64(dy), f64(x), f64(w), want_pre, activation, has_bias,
                                                       x_activation, f64(x_pre))):
        assert (ours is None) == (theirs is None)
        assert ours is None or rel_err(gpu.to_numpy(ours), theirs) <= rtol
    if forward_kernel.startswith("lesson"):  # the autotuner may pick the lesson's kernel for a tiny shape: it
        assert count <= 5  # has no epilogue, so bias, GELU (its input kept) and residual are separate ops
    else:
        assert count <= 2  # the matmul, and split-K's finish where the variant splits


def test_a_linear_layer_of_any_leading_axes_plans_the_matmul_of_its_rows(gpu, monkeypatch):
    """x (..., in) under a weight (out, in) is planned as x's rows (N, in) @ weight.T: the rows' kernel and tuning
    key (batch 1, M = N), not a batch of the last leading axis's rows sharing the weight (interface 4)."""
    g = np.random.default_rng(4)
    lead, n_in, n_out = (3, 5, 2), 70, 19
    x, w, bias = g.standard_normal(lead + (n_in,)), g.standard_normal((n_out, n_in)), g.standard_normal(n_out)
    monkeypatch.setattr(gpu, "matmul_plans", {})  # planned afresh, whatever ran before
    planned, plan = [], gpu.mm.plan
    monkeypatch.setattr(gpu.mm, "plan", lambda *args: (planned.append(args[3:10]), plan(*args))[1])
    y, pre = gpu.linear_forward(*(gpu.from_numpy(a.astype(np.float32)) for a in (x, w, bias)), activation="gelu")
    assert planned == [(1, 30, n_out, n_in, False, True, False)]  # batch, m, n, k, transposes, b shared
    want_y, want_pre = REF.linear_forward(x, w, bias, None, "gelu")
    assert rel_err(gpu.to_numpy(y), want_y) <= 1e-4 and rel_err(gpu.to_numpy(pre), want_pre) <= 1e-4
