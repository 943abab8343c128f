"""LayerNorm (ops/layernorm.py) against float64 NumPy, outputs poisoned with NaN: every form of the kernel (Value width,
Values a step), the backward's splits and column groups, with subgroups and without."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinynn import backends
from tinynn_gpu.ops import group_sum, layernorm as layernorm_ops

from gpu_checks import dispatches, rel_err

REF = backends.reference()


FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


dims = st.one_of(st.sampled_from([1, 2, 31, 32, 33, 255, 256, 257]), st.integers(1, 300))


@FEW
@given(rows=st.one_of(st.integers(1, 70), st.sampled_from([31, 32, 33, 1000])), cols=dims,
       weight=st.booleans(), bias=st.booleans(), add=st.booleans(), split_rows=st.sampled_from([7, 2048]),
       group_cols=st.sampled_from([1, 4, 8, 256, 1024]), seed=st.integers(0, 2**31))
def test_layernorm_backward(subgroup_path, monkeypatch, rows, cols, weight, bias, add, split_rows, group_cols, seed):
    """One dispatch, or with rows in several splits (split_rows 7) a finish after it; g_add folded into g_x;
    the column sums' workgroups 1 to 1024 columns wide (in the kernel's Values: 1 to 256)."""
    gpu, g = subgroup_path, np.random.default_rng(seed)
    monkeypatch.setattr(layernorm_ops, "SPLIT_ROWS", split_rows)
    monkeypatch.setattr(layernorm_ops, "GROUP_COLS", {1: {0: group_cols}, 4: {0: group_cols}})
    x, dy = (g.standard_normal((rows, cols)) * 2).astype(np.float32), g.standard_normal((rows, cols)).astype(np.float32)
    w = g.standard_normal(cols).astype(np.float32) if weight else None
    b = g.standard_normal(cols).astype(np.float32) if bias else None
    g_add = g.standard_normal((rows, cols)).astype(np.float32) if add else None
    _, mean, rstd = REF.layernorm_forward(x.astype(np.float64), w, b, 1e-5)
    ours, count = dispatches(gpu, lambda: gpu.layernorm_backward(
        gpu.from_numpy(dy), gpu.from_numpy(x), None if w is None else gpu.from_numpy(w),
        gpu.from_numpy(mean.astype(np.float32)), gpu.from_numpy(rstd.astype(np.float32)), has_bias=bias,
        g_add=None if g_add is None else gpu.from_numpy(g_add)))
    assert count == (2 if (weight or bias) and rows > split_rows else 1)
    theirs = REF.layernorm_backward(dy.astype(np.float64), x.astype(np.float64), w, mean, rstd, has_bias=bias,
                                    g_add=g_add)
    scale = np.linalg.norm(rstd[:, None] * dy * (1 if w is None else w)) + (0 if g_add is None else np.linalg.norm(g_add))
    for o, t in zip(ours, theirs):
        assert (o is None) == (t is None)
        assert o is None or rel_err(gpu.to_numpy(o), t) <= 1e-4 or o is ours[0] and \
            np.linalg.norm(gpu.to_numpy(o) - t) <= 1e-5 * scale


# a C for each of layernorm.wgsl's forms (group_sum.row_values: Values of 1 or 4 floats, 1 to 8 a step): on 32-wide
# teams rows shorter than a step, one partial step (768), whole steps and a partial one (1028, 2049, 2052), whole
# steps only (4096); on narrower subgroups (lavapipe's 8) more whole steps
LAYERNORM_WIDTHS = [1, 3, 4, 33, 65, 132, 256, 260, 516, 768, 1028, 2049, 2052, 4096]


def test_layernorm_widths_cover_every_form():
    assert {group_sum.row_values(c) for c in LAYERNORM_WIDTHS} == {(w, s) for w in (1, 4) for s in (1, 2, 4, 8)}


@pytest.mark.parametrize("cols", LAYERNORM_WIDTHS)
@pytest.mark.parametrize("rows", [1, 9, 23])
def test_layernorm_every_form(subgroup_path, monkeypatch, rows, cols):
    """The forward and the backward (g_add, rows in splits of 7 and their finish) in each of the kernel's forms."""
    gpu, g = subgroup_path, np.random.default_rng(rows * 10_000 + cols)
    monkeypatch.setattr(layernorm_ops, "SPLIT_ROWS", 7)
    x, dy, g_add = ((g.standard_normal((rows, cols)) * 2).astype(np.float32) for _ in range(3))
    w, b = (g.standard_normal(cols).astype(np.float32) for _ in range(2))
    y, mean, rstd = gpu.layernorm_forward(*(gpu.from_numpy(a) for a in (x, w, b)), 1e-5)
    forward64 = REF.layernorm_forward(x.astype(np.float64), w, b, 1e-5)
    for ours, theirs in zip((y, mean, rstd), forward64):
        assert rel_err(gpu.to_numpy(ours), theirs) <= 1e-5
    _, mean64, rstd64 = forward64
    ours = gpu.layernorm_backward(*(gpu.from_numpy(a) for a in (dy, x, w)), mean, rstd, g_add=gpu.from_numpy(g_add))
    theirs = REF.layernorm_backward(dy.astype(np.float64), x.astype(np.float64), w, mean64, rstd64, g_add=g_add)
    for o, t in zip(ours, theirs):
        assert rel_err(gpu.to_numpy(o), t) <= 1e-4


@pytest.mark.parametrize("cols, group_cols", [(256, 1), (511, 4), (512, 4), (768, 4), (770, 8)])
def test_layernorm_backward_column_groups_by_width(gpu, monkeypatch, cols, group_cols):
    """The column workgroups' width comes from layernorm.py's GROUP_COLS by the Value width and C, in the kernel's
    Values (a vec4 where C is a multiple of 4: 4 columns are 1 Value, 16 are 4; floats at 511 and 770), and the
    gradients agree with it."""
    seen, dispatch = [], gpu.rt.dispatch
    monkeypatch.setattr(gpu.rt, "dispatch", lambda *args: (seen.append(args[1:5:3]), dispatch(*args))[1])
    g = np.random.default_rng(cols)
    x, dy, w = g.standard_normal((40, cols)), g.standard_normal((40, cols)), g.standard_normal(cols)
    _, mean, rstd = REF.layernorm_forward(x, w, None, 1e-5)
    ours = gpu.layernorm_backward(*(gpu.from_numpy(a.astype(np.float32)) for a in (dy, x, w, mean, rstd)))
    assert [params["group_cols"] for entry, params in seen if entry == "layernorm_backward_main"] == [group_cols]
    for o, t in zip(ours, REF.layernorm_backward(dy, x, w, mean, rstd)):
        assert rel_err(gpu.to_numpy(o), t) <= 1e-4
