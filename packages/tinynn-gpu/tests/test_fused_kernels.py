"""The fused and bandwidth-bound kernels against float64 NumPy, outputs poisoned with NaN, on drawn edge
shapes: linear layers with their epilogues, one-dispatch reductions, LayerNorm's gradients, the multi-tensor
gradient norm and AdamW. Kernels with a workgroup sum run twice: with subgroup operations (where the
adapter has them) and with the workgroup-memory path."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinynn import backends
from tinynn_gpu.ops import layernorm as layernorm_ops
from tinynn_gpu.ops import group_sum, multi_tensor
from tinynn_gpu.ops.multi_tensor import ADAMW_CHUNK, SQUARES_CHUNK

REF = backends.reference()
RTOL = 1e-5
FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
dims = st.one_of(st.sampled_from([1, 2, 31, 32, 33, 255, 256, 257]), st.integers(1, 300))


def rel_err(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    assert np.isfinite(actual).all(), "unwritten (NaN) or non-finite elements"
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30))


def dispatches(gpu, fn):
    """fn()'s result and how many kernels it dispatched (the poisoning fills not counted)."""
    entries, plain = [], gpu.rt.launch

    def counted(launch, arrays):  # every dispatch, prepared afresh or kept, is launched
        if launch is not None:
            entries.append(launch.entry)
        return plain(launch, arrays)
    gpu.rt.launch = counted
    try:
        result = fn()
    finally:
        del gpu.rt.launch
    return result, sum(entry != "fill_main" for entry in entries)


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
    # g_x is a difference of terms of size rstd * dy * w that can cancel almost to nothing (2 columns: each
    # x is the mean +- one deviation); float32 then owes accuracy to those terms, not to the small result.


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
    """The column workgroups' width comes from layernorm.py's GROUP_COLS by the Value width and C, in the kernel's Values
    (a vec4 where C is a multiple of 4: 4 columns are 1 Value, 16 are 4; floats at 511 and 770), and the gradients
    agree with it."""
    seen, dispatch = [], gpu.rt.dispatch
    monkeypatch.setattr(gpu.rt, "dispatch", lambda *args: (seen.append(args[1:5:3]), dispatch(*args))[1])
    g = np.random.default_rng(cols)
    x, dy, w = g.standard_normal((40, cols)), g.standard_normal((40, cols)), g.standard_normal(cols)
    _, mean, rstd = REF.layernorm_forward(x, w, None, 1e-5)
    ours = gpu.layernorm_backward(*(gpu.from_numpy(a.astype(np.float32)) for a in (dy, x, w, mean, rstd)))
    assert [params["group_cols"] for entry, params in seen if entry == "layernorm_backward_main"] == [group_cols]
    for o, t in zip(ours, REF.layernorm_backward(dy, x, w, mean, rstd)):
        assert rel_err(gpu.to_numpy(o), t) <= 1e-4


sizes = st.one_of(st.integers(1, 600), st.sampled_from([ADAMW_CHUNK - 1, ADAMW_CHUNK + 1, SQUARES_CHUNK + 3]))


def check_norm_and_adamw(gpu, monkeypatch, shapes, workgroups, seed):
    """The norm, the clip coefficient and AdamW (with it) against float64 NumPy; `workgroups` wanted by the
    sums of squares' chunk rule (1: a chunk its most elements, SQUARES_CHUNK; 2048: its fewest)."""
    g = np.random.default_rng(seed)
    monkeypatch.setattr(multi_tensor, "SQUARES_WORKGROUPS", workgroups)
    params, grads, ms, vs = ([g.standard_normal(n).astype(np.float32) for n in shapes] for _ in range(4))
    vs = [np.abs(v) for v in vs]
    norm = gpu.global_norm([gpu.from_numpy(a) for a in grads])
    want = np.sqrt(sum((a.astype(np.float64) ** 2).sum() for a in grads))
    assert rel_err(gpu.to_numpy(norm), want) <= RTOL
    hyper = np.array([1e-2, 0.1, 0.01], np.float32)
    (norm, scale), count = dispatches(gpu, lambda: gpu.global_norm_and_clip([gpu.from_numpy(a) for a in grads], 1.0))
    assert rel_err(gpu.to_numpy(norm), want) <= RTOL
    assert count == -(-len(grads) // gpu.multi.square_slots) + 1  # the sums of squares, then one finish for both
    on_gpu = [[gpu.from_numpy(a) for a in kind] for kind in (params, grads, ms, vs)]
    _, count = dispatches(gpu, lambda: gpu.adamw_update_(*on_gpu, gpu.from_numpy(hyper), beta1=0.9, beta2=0.95,
                                                         eps=1e-8, weight_decay=0.1, grad_scale=scale))
    assert count == -(-len(params) // gpu.multi.slots)
    expected = [[a.astype(np.float64) for a in kind] for kind in (params, grads, ms, vs)]
    REF.adamw_update_(*expected, hyper.astype(np.float64), beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                      grad_scale=np.float64(min(1.0, 1.0 / (want + 1e-6))))
    for kind, ours, theirs in zip("pgmv", on_gpu, expected):
        for o, t in zip(ours, theirs):
            assert rel_err(gpu.to_numpy(o), t) <= RTOL, kind


@FEW
@given(shapes=st.lists(sizes, min_size=1, max_size=12), workgroups=st.sampled_from([1, 3, 2048]),
       seed=st.integers(0, 2**31))
def test_global_norm_and_adamw_over_many_tensors(subgroup_path, monkeypatch, shapes, workgroups, seed):
    """More tensors than one AdamW dispatch's slots on lavapipe (7), sizes across the chunk boundaries; the
    sums of squares' chunk from its smallest to SQUARES_CHUNK (few workgroups wanted)."""
    check_norm_and_adamw(subgroup_path, monkeypatch, shapes, workgroups, seed)


@pytest.mark.parametrize("workgroups", [1, 2048])
@pytest.mark.parametrize("shapes", [
    [1, 2, 3, 4, 5, 6, 7],
    [1021, 1027, 2047, 2049, 2050, 2051, 3071, 4099, 8189, 16387, 16390],
    [1 + i % 7 for i in range(70)] + [4097, 2 * ADAMW_CHUNK + 5],
], ids=["1-to-7-elements", "n-mod-4-tails-at-chunk-edges", "more-tensors-than-slots"])
def test_global_norm_and_adamw_edges(subgroup_path, monkeypatch, shapes, workgroups):
    """The kernels' edges: tensors shorter than a thread's four-element step, sizes just off a multiple of
    four at a chunk's edges (the one-element tail loops; nothing written past the end: the poisoned tails);
    more tensors than MAX_SLOTS (64), so two dispatches even where every slot binds."""
    check_norm_and_adamw(subgroup_path, monkeypatch, shapes, workgroups, len(shapes))


@FEW
@given(batch=st.integers(1, 9), t=st.one_of(st.integers(1, 40), st.just(257)), extra=st.integers(0, 3),
       vocab=st.integers(1, 70), cols=dims, seed=st.integers(0, 2**31))
def test_embedding_with_positions(poisoned, batch, t, extra, vocab, cols, seed):
    """A GPT's input in one dispatch, and its two gradients in one (the position rows summed over a batch
    shorter and longer than the four sequences a thread loads at once)."""
    gpu, g = poisoned, np.random.default_rng(seed)
    wte, wpe = g.standard_normal((vocab, cols)).astype(np.float32), g.standard_normal((t + extra, cols)).astype(np.float32)
    idx, dy = g.integers(0, vocab, (batch, t)), g.standard_normal((batch, t, cols)).astype(np.float32)
    y, count = dispatches(gpu, lambda: gpu.embedding_with_positions_forward(gpu.from_numpy(wte), gpu.from_numpy(wpe),
                                                                            gpu.from_numpy(idx)))
    assert count == 1
    assert rel_err(gpu.to_numpy(y), REF.embedding_with_positions_forward(wte.astype(np.float64), wpe, idx)) <= RTOL
    (g_wte, g_wpe), count = dispatches(gpu, lambda: gpu.embedding_with_positions_backward(
        gpu.from_numpy(dy), gpu.from_numpy(idx), vocab, t + extra))
    want_wte, want_wpe = REF.embedding_with_positions_backward(dy.astype(np.float64), idx, vocab, t + extra)
    assert rel_err(gpu.to_numpy(g_wte), want_wte) <= RTOL and rel_err(gpu.to_numpy(g_wpe), want_wpe) <= RTOL
    assert count == 1


@pytest.mark.parametrize("batch, t, vocab, cols", [(9, 257, 3, 40), (2, 33, 600, 70), (1, 1, 1, 1)],
                         ids=["ids-in-two-chunks", "one-block-a-row", "one-id"])
def test_embedding_with_positions_backward_edges(poisoned, rng, batch, t, vocab, cols):
    """More ids than one workgroup lists at once (2048: a row's sums carried over chunks); a vocabulary large
    enough that each row's columns take one workgroup; a single id."""
    idx, dy = rng.integers(0, vocab, (batch, t)), rng.standard_normal((batch, t, cols)).astype(np.float32)
    g_wte, g_wpe = poisoned.embedding_with_positions_backward(poisoned.from_numpy(dy), poisoned.from_numpy(idx),
                                                              vocab, t + 2)
    want_wte, want_wpe = REF.embedding_with_positions_backward(dy.astype(np.float64), idx, vocab, t + 2)
    assert rel_err(poisoned.to_numpy(g_wte), want_wte) <= RTOL and rel_err(poisoned.to_numpy(g_wpe), want_wpe) <= RTOL
