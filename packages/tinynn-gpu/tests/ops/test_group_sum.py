"""The row kernels at any width, against NumPy: softmax (a workgroup a row) and the row teams of LayerNorm and cross
entropy (ops/group_sum.py), with subgroups and without."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinynn_gpu.ops import group_sum

from gpu_checks import rel_err

RTOL = 1e-5


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 40), cols=st.one_of(st.integers(1, 300), st.sampled_from([255, 256, 257, 1000])),
       seed=st.integers(0, 2**31))
def test_row_kernels_any_width(subgroup_path, rows, cols, seed):
    """The row kernels for widths below, at and above a workgroup's 256 threads and a team's 32 (or a
    subgroup's width), rows not a multiple of a workgroup's 8 (LayerNorm, cross entropy)."""
    gpu, ref = subgroup_path, __import__("tinynn").backends.reference()
    g = np.random.default_rng(seed)
    x = (g.standard_normal((rows, cols)) * 3).astype(np.float32)
    w, b = g.standard_normal(cols).astype(np.float32), g.standard_normal(cols).astype(np.float32)
    dx, dw, db = gpu.from_numpy(x), gpu.from_numpy(w), gpu.from_numpy(b)
    for name, args in [("softmax_forward", ()), ("log_softmax_forward", ())]:
        assert rel_err(gpu.to_numpy(getattr(gpu, name)(dx, *args)), getattr(ref, name)(x.astype(np.float64))) <= RTOL
    for ours, theirs in zip(gpu.layernorm_forward(dx, dw, db, 1e-5), ref.layernorm_forward(x.astype(np.float64),
                                                                                          w, b, 1e-5)):
        assert rel_err(gpu.to_numpy(ours), theirs) <= RTOL
    t = g.integers(0, cols, rows)
    loss, _, _ = gpu.cross_entropy_forward(dx, gpu.from_numpy(t), -100)
    ref_loss, _, _ = ref.cross_entropy_forward(x.astype(np.float64), t, -100)
    # a loss near 0 (the target's probability near 1) is log(1 + d) in float32: accurate relative to 1, not d
    assert abs(gpu.to_numpy(loss) - ref_loss) <= RTOL * max(abs(ref_loss), 1.0)


def test_row_kernels_keep_a_launch_per_path(subgroup_path, monkeypatch):
    """LayerNorm's and cross entropy's forwards keep their launches under the path, not the shader (looked up
    only on a miss): one shape on each path (the parameters before this one ran it too) runs that path's
    kernels. Either kernel gives the right numbers, so only the shader shows a stale launch."""
    gpu, used, launch = subgroup_path, {}, subgroup_path.rt.launch

    def spy(prepared, arrays):  # entry point -> shader, of every launch (not only the op's)
        used[prepared.entry] = prepared.shader
        launch(prepared, arrays)
    monkeypatch.setattr(gpu.rt, "launch", spy)
    x = gpu.from_numpy(np.ones((3, 40), np.float32))
    gpu.layernorm_forward(x, None, None, 1e-5)
    gpu.cross_entropy_forward(x, gpu.from_numpy(np.zeros(3, np.int64)), -100)
    assert used["layernorm_forward_main"] is group_sum.shader(gpu.rt, "layernorm", *group_sum.row_values(40))
    for entry in ("cross_entropy_forward_rows_main", "cross_entropy_forward_mean_main"):
        assert used[entry] is group_sum.shader(gpu.rt, "cross_entropy")
