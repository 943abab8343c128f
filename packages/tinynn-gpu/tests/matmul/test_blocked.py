"""The register-blocked matmul (matmul/blocked.py) against a float64 NumPy reference, every output poisoned (NaN)
before the run. Shapes are drawn by hypothesis: sizes off the tile grid, B = 1, M/N/K = 1, K much larger than the
tile."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinynn.numpy_backend import NUMPY
from tinynn_gpu.matmul.blocked import BlockedMatmul, generate, generate_pair
from tinynn_gpu.matmul.configs import BLOCK_CONFIGS, BlockConfig
from tinynn_gpu.matmul.paired import PairedMatmul
from tinynn_gpu.matmul.problem import Epilogue, problem_plan

from gpu_checks import reference, rel_err

RTOL = 1e-5
dims = st.one_of(st.integers(1, 3), st.integers(4, 70), st.sampled_from([1, 15, 16, 17, 31, 32, 33]))


matmul_cases = st.tuples(st.integers(1, 3), dims, dims, st.one_of(dims, st.integers(200, 700)),
                         st.booleans(), st.booleans(), st.booleans(), st.integers(0, 2**31))


def operands(case):
    """Random a and b for a drawn case, stored as its layout says (transposed, b shared by the batch)."""
    batch, m, n, k, ta, tb, shared, seed = case
    g = np.random.default_rng(seed)
    a = g.standard_normal((batch, k, m) if ta else (batch, m, k)).astype(np.float32)
    b = g.standard_normal(((n, k) if tb else (k, n)) if shared else ((batch, n, k) if tb else (batch, k, n)))
    return a, b.astype(np.float32)


def matmul_err(actual, a, b, ta, tb):
    """A product's error relative to the size of its terms (|a| @ |b|), not of its result: a drawn 1 x 1
    output whose k products nearly cancel has a tiny result, and float32 summation error relative to it
    can be large for the exact same (correct) arithmetic."""
    exact = reference(a, b, ta, tb)
    rel_err(actual, exact)  # its shape and NaN checks
    return float(np.linalg.norm(np.asarray(actual, np.float64) - exact) /
                 max(np.linalg.norm(reference(np.abs(a), np.abs(b), ta, tb)), 1e-30))


def epilogue_for(case, gpu):
    """An epilogue drawn from the case's seed (bias, GELU or GELU's gradient, residual, row sums each on or
    off), its GPU arrays, and a function giving (out, pre, row_sums) in float64 from the plain product."""
    batch, m, n, k, ta, tb, shared, seed = case
    g = np.random.default_rng(seed)
    bias = g.standard_normal(n).astype(np.float32) if seed & 1 else None
    gelu = bool(seed & 2)
    residual = g.standard_normal((batch, m, n)).astype(np.float32) if seed & 4 else None
    row_sums = bool(seed & 8)
    gelu_input = g.standard_normal((batch, m, n)).astype(np.float32) if seed & 16 and not gelu else None
    pre = gpu.rt.empty((batch, m, n)) if gelu else None if gelu_input is None else gpu.from_numpy(gelu_input)
    epilogue = Epilogue(None if bias is None else gpu.from_numpy(bias), "gelu" if gelu else None, pre,
                        None if residual is None else gpu.from_numpy(residual),
                        gpu.rt.empty((batch, m)) if row_sums else None,
                        None if gelu_input is None else "gelu")

    def expected(product, a):
        if gelu_input is not None:  # the product is a GELU output's gradient: its input's gradient is stored
            product = NUMPY.unary_backward("gelu", gelu_input.astype(np.float64), None, product)
        pre = product + (0 if bias is None else bias)
        out = NUMPY.unary("gelu", pre) if gelu else pre
        a = a.astype(np.float64)
        pre = pre if gelu_input is None else gelu_input
        return out + (0 if residual is None else residual), pre, (a.sum(-2) if ta else a.sum(-1))
    return epilogue, expected


# the generator's other designs (BlockConfig.ahead, .spread, row sums summed by BM / 4 threads) for
# experiments/matmul_designs.py, beyond the one shipped candidate with ahead = 2; each within the 32 KB of workgroup
# memory lavapipe offers
DESIGN_CONFIGS = (BlockConfig(64, 64, 16, 8, 4, vec4=True, double=True, ahead=2),
                  BlockConfig(64, 64, 8, 8, 4, vec4=True, double=True, ahead=2, spread=True),
                  BlockConfig(32, 64, 16, 4, 4, splits=4, vec4=True, double=True, ahead=2, spread=True),
                  BlockConfig(32, 32, 16, 4, 4, double=True, ahead=2),
                  BlockConfig(64, 32, 16, 4, 4, vec4=True, spread=True),
                  BlockConfig(32, 96, 16, 4, 4))  # more threads than A-tile vec4s: its row sums take one quad each


@pytest.mark.parametrize("config", BLOCK_CONFIGS + DESIGN_CONFIGS, ids=lambda c: c.name)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=matmul_cases)
def test_blocked_matmul_every_variant(poisoned, config, case):
    check_blocked(poisoned, config, case)


def assert_matmul_result(gpu, out, epilogue, expected, a, b, ta, tb, rtol=RTOL):
    """out, and the epilogue's side outputs, against float64 (row sums always within float32's RTOL)."""
    want, pre, row_sums = expected(reference(a, b, ta, tb), a)
    # float32 owes a product accuracy relative to |op(a)| @ |op(b)|, not to a sum that cancels to near 0
    magnitude = np.linalg.norm(reference(np.abs(a), np.abs(b), ta, tb))
    assert np.linalg.norm(gpu.to_numpy(out) - want) <= rtol * max(np.linalg.norm(want), magnitude)
    if epilogue.pre is not None:
        assert np.linalg.norm(gpu.to_numpy(epilogue.pre) - pre) <= rtol * max(np.linalg.norm(pre), magnitude)
    if epilogue.row_sums is not None:  # sums over k of op(a): owed accuracy relative to the sums of |op(a)|
        got = gpu.to_numpy(epilogue.row_sums)
        assert np.isfinite(got).all(), "unwritten (NaN) or non-finite row sums"
        row_magnitude = np.linalg.norm(np.abs(a).sum(axis=-2 if ta else -1))
        assert np.linalg.norm(got - row_sums) <= RTOL * max(np.linalg.norm(row_sums), row_magnitude)


def check_blocked(gpu, config, case):
    """One drawn case through one variant, a drawn epilogue included, against float64."""
    batch, m, n, k, ta, tb, shared, _ = case
    a, b = operands(case)
    epilogue, expected = epilogue_for(case, gpu)
    da, db, out = gpu.from_numpy(a), gpu.from_numpy(b), gpu.rt.empty((batch, m, n))
    assert BlockedMatmul(gpu.rt, config).record(da, db, out, batch, m, n, k, ta, tb, shared, epilogue)
    assert_matmul_result(gpu, out, epilogue, expected, a, b, ta, tb)


quads = st.integers(1, 40).map(lambda q: 4 * q)


@pytest.mark.parametrize("config", [c for c in BLOCK_CONFIGS + DESIGN_CONFIGS if c.vec4], ids=lambda c: c.name)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.tuples(st.integers(1, 2), quads, quads, st.one_of(quads, st.sampled_from([260, 516])), st.booleans(),
                      st.booleans(), st.booleans(), st.integers(0, 2**31)))
def test_vec4_loads(poisoned, config, case):
    """Shapes whose contiguous dimensions are multiples of 4, where the vec4-load code runs."""
    batch, m, n, k, ta, tb, shared, _ = case
    assert config.uses_vec4(m, n, k, ta, tb)
    check_blocked(poisoned, config, case)


@pytest.mark.parametrize("config", BLOCK_CONFIGS + DESIGN_CONFIGS, ids=lambda c: c.name)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 2), st.integers(1, 3), st.booleans(),
                      st.booleans(), st.booleans(), st.integers(0, 2**31)))
def test_aligned_tiles_load_unchecked(poisoned, config, case):
    """Shapes of whole tiles (M, N, K multiples of the block, every split with work): the variant whose loads
    skip the bounds checks runs, and agrees with float64."""
    batch, rows, columns, steps, ta, tb, shared, seed = case
    m, n, k = config.bm * rows, config.bn * columns, config.bk * config.splits * steps
    a, b = operands((batch, m, n, k, ta, tb, shared, seed))
    epilogue, expected = epilogue_for((batch, m, n, k, ta, tb, shared, seed), poisoned)
    da, db, out = poisoned.from_numpy(a), poisoned.from_numpy(b), poisoned.rt.empty((batch, m, n))
    matmul = BlockedMatmul(poisoned.rt, config)
    assert matmul.record(da, db, out, batch, m, n, k, ta, tb, shared, epilogue)
    assert [layout[3] for layout, _ in matmul.modules] == [True]
    assert_matmul_result(poisoned, out, epilogue, expected, a, b, ta, tb)


# a pair's module shares the row sums among the block's threads (blocked._row_sums): each form of that code,
# (THREADS / (BM / 4) groups of k dividing BK, not dividing it, more than BK; unpadded tiles; split-K; the first
# BM / 4 threads instead), in blocks that lavapipe compiles quickly but the H200's own
SHARED_ROW_SUMS = (BlockConfig(32, 64, 16, 4, 4), BlockConfig(64, 64, 16, 8, 4),
                   BlockConfig(64, 96, 16, 8, 4, vec4=True, double=True), BlockConfig(32, 64, 8, 4, 4, double=True),
                   BlockConfig(128, 128, 16, 8, 8, vec4=True, double=True, pad=False),
                   BlockConfig(32, 64, 16, 4, 4, splits=4, double=True), BlockConfig(32, 96, 16, 4, 4))


SHARED_FORM = "the loop's last barrier has passed"  # the comment on the shared form's reduction after the loop


def test_only_pairs_share_the_row_sums_and_only_where_the_block_allows():
    """test_row_sums passes with either form: here each block gets the one meant for it."""
    layout = (True, False, False, False)  # A transposed, as a weight gradient's
    for config in SHARED_ROW_SUMS + BLOCK_CONFIGS:
        fits = config.threads % (config.bm // 4) == 0 and \
            config.threads <= config.buffers * config.bk * (config.bm // 4 + config.pad)  # the A tiles' vec4s
        assert (SHARED_FORM in generate_pair(config, layout, layout)) == fits, config.name
        assert SHARED_FORM not in generate(config, *layout), config.name
    assert SHARED_FORM not in generate_pair(SHARED_ROW_SUMS[-1], layout, layout)  # more threads than A-tile vec4s


@pytest.mark.parametrize("config, transpose_a, paired, empty_split",
                         [(c, ta, None, False) for c in BLOCK_CONFIGS + DESIGN_CONFIGS for ta in (True, False)]
                         + [(c, True, "first", False) for c in SHARED_ROW_SUMS]
                         + [(c, True, "second", False) for c in SHARED_ROW_SUMS[:2]]
                         + [(c, True, paired, True) for c in SHARED_ROW_SUMS + BLOCK_CONFIGS if c.splits > 2
                            for paired in (None, "first")],
                         ids=lambda v: v.name if isinstance(v, BlockConfig) else str(v))
def test_row_sums(poisoned, rng, config, transpose_a, paired, empty_split):
    """The row sums (a weight gradient's bias gradient: A transposed) over several tiles of k, K not a multiple of
    BK, and rows past one block: summed by the first BM / 4 threads, or in a pair's module (either problem: the one
    with the longer K chunk goes first) shared by the block's threads, whose partial sums meet after the loop. With
    `empty_split`, K leaves the last split of split-K no tile: its loop runs no iteration, its row sums are zeros."""
    m, n = config.bm + 3, 5
    k = (config.splits + 1) * config.bk if empty_split else 3 * config.bk * config.splits + 5
    if empty_split:  # (the other K leaves one empty too where splits reach 6)
        splits, _, params = problem_plan(config, config.splits, 1, m, n, k, transpose_a, False, False, Epilogue())
        assert (splits - 1) * params["k_chunk"] >= k
    a = rng.standard_normal((k, m) if transpose_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    out, row_sums = poisoned.rt.empty((1, m, n)), poisoned.rt.empty((1, m))
    problem = (1, m, n, k, transpose_a, False, False, Epilogue(row_sums=row_sums))
    arrays = (poisoned.from_numpy(a), poisoned.from_numpy(b), out, Epilogue(row_sums=row_sums))
    if paired:
        k1 = 3 if paired == "first" else 2 * k  # the other problem's K chunk: shorter, or longer than ours
        a1, b1 = (rng.standard_normal((2, k1)).astype(np.float32) for _ in range(2))
        out1 = poisoned.rt.empty((1, 2, 2))
        PairedMatmul(poisoned.rt, config, (1, config.splits)).plan((1, 2, 2, k1, False, True, False, Epilogue()),
                                                                   problem)(
            poisoned.from_numpy(a1), poisoned.from_numpy(b1), out1, Epilogue(), *arrays)
        assert rel_err(poisoned.to_numpy(out1)[0], reference(a1, b1, False, True)) <= RTOL
    else:
        BlockedMatmul(poisoned.rt, config).record(*arrays[:3], *problem[:7], arrays[3])
    assert rel_err(poisoned.to_numpy(out)[0], reference(a, b, transpose_a, False)) <= RTOL
    assert rel_err(poisoned.to_numpy(row_sums)[0], a.astype(np.float64).sum(0 if transpose_a else 1)) <= RTOL


@pytest.mark.parametrize("config", [BlockConfig(64, 64, 16, 4, 4, ahead=2),
                                    BlockConfig(64, 64, 16, 4, 4, double=True, ahead=3),
                                    BlockConfig(64, 64, 4, 4, 4, vec4=True, spread=True),
                                    BlockConfig(40, 64, 16, 4, 4, vec4=True, spread=True)], ids=lambda c: c.name)
def test_design_options_refuse_what_they_cannot_do(config):
    """Loads two tiles ahead need the second tile buffer; spread loads a warp's 2 quads of k by 16 rows."""
    with pytest.raises(ValueError, match="tiles ahead, 2 only|spread loads need"):
        config.check()


def test_a_split_without_work_is_not_aligned():
    """K = 80 in 4 splits of BK 16: the splits take 32, 32, 16 and nothing, and the empty one's first tile
    would load past K; such shapes keep the checked loads."""
    config = BlockConfig(32, 32, 16, 4, 4, splits=4)
    assert not config.aligned(64, 64, 80, 4, 32)
    assert config.aligned(64, 64, 128, 4, 32)
    assert not config.aligned(64, 48, 128, 4, 32)


@pytest.mark.parametrize("n", [4, 8, 52, 3, 50])
@pytest.mark.parametrize("splits", [1, 3])
def test_quad_stores_where_every_row_starts_on_a_quad(poisoned, n, splits):
    """N a multiple of 4: a thread stores its 4 columns of a row as one vec4, and the epilogue and the split-K
    finish read and write their arrays 4 columns at a time (N = 4: the finish's thread per row sums too); other
    N: 4 floats. Each epilogue (bias, GELU, residual, row sums; GELU's gradient instead) against float64."""
    config = BlockConfig(64, 64, 16, 8, 4, splits=splits, vec4=True, double=True)
    for seed in (1 | 2 | 4 | 8, 1 | 4 | 8 | 16):
        case = (2, 37, n, 70, False, False, False, seed)
        a, b = operands(case)
        epilogue, expected = epilogue_for(case, poisoned)
        out = poisoned.rt.empty((2, 37, n))
        matmul = BlockedMatmul(poisoned.rt, config)
        assert matmul.record(poisoned.from_numpy(a), poisoned.from_numpy(b), out, 2, 37, n, 70, False, False, False,
                             epilogue)
        assert [quads for _, quads in matmul.modules] == [n % 4 == 0]
        assert_matmul_result(poisoned, out, epilogue, expected, a, b, False, False)


@pytest.mark.parametrize("n", [2, 4])
def test_split_k_grid_past_65535_workgroups(poisoned, rng, n):
    """batch x splits above the 65535 workgroups a dispatch dimension allows: launched in pieces. N = 4: quad
    stores, and the finish's thread per row sums every row (as many Values as rows)."""
    config = BlockConfig(32, 32, 8, 4, 4, splits=4)
    batch, k = 17_000, 32  # 68,000 workgroups along z
    a = rng.standard_normal((batch, 1, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    gpu = poisoned
    out, row_sums = gpu.rt.empty((batch, 1, n)), gpu.rt.empty((batch, 1))
    matmul = BlockedMatmul(gpu.rt, config)
    matmul.record(gpu.from_numpy(a), gpu.from_numpy(b), out, batch, 1, n, k, False, False, False,
                  Epilogue(row_sums=row_sums))
    assert [quads for _, quads in matmul.modules] == [n % 4 == 0]
    assert rel_err(gpu.to_numpy(out), reference(a, b, False, False)) <= RTOL
    assert rel_err(gpu.to_numpy(row_sums), a.astype(np.float64).sum(-1)) <= RTOL


@pytest.mark.parametrize("n", [4, 3])
def test_a_grid_past_65535_block_rows(poisoned, n):
    """M above 65535 block-rows: the rows are launched in pieces (y_offset), each storing its rows' quads (N = 4)
    or floats (N = 3) where they belong, with the whole epilogue, split (z too: the finish adds the splits)."""
    config = BlockConfig(4, 4, 4, 4, 4, splits=2)  # one thread a block: 65,537 block-rows stay cheap on lavapipe
    m, k = 4 * 65_535 + 7, 8
    case = (1, m, n, k, False, False, False, 1 | 2 | 4 | 8)  # bias, GELU, residual, row sums
    a, b = operands(case)
    epilogue, expected = epilogue_for(case, poisoned)
    out = poisoned.rt.empty((1, m, n))
    matmul = BlockedMatmul(poisoned.rt, config)
    assert matmul.record(poisoned.from_numpy(a), poisoned.from_numpy(b), out, 1, m, n, k, False, False, False,
                         epilogue)
    (_, launches, finish), = matmul.plans.values()
    assert [launch.groups for launch in launches] == [(1, 65_535, 2), (1, 2, 2)] and finish is not None
    assert_matmul_result(poisoned, out, epilogue, expected, a, b, False, False)


def test_gelu_epilogues_at_extreme_inputs(poisoned):
    """The blocked matmul's GELU epilogues (the forward's GELU and its `pre`, the backward's gradient of it) against
    the elementwise op's, from common.wgsl's same functions (test_backend_ops checks those against float64 at the
    same inputs): x as a column times a row of ones (x in every column), then GELU; and a product of ones times
    GELU's gradient at x."""
    gpu = poisoned
    # 1e-30 to 3e38 log-spaced, and densely across the sigmoid's over- and underflow (|x| 5 to 13), both signs
    magnitudes = np.concatenate([np.geomspace(1e-30, 3e38, 40), np.linspace(5, 13, 17)])
    x = np.concatenate([-magnitudes, [0], magnitudes]).astype(np.float32)
    n = len(x)
    dx = gpu.from_numpy(x)
    y = gpu.unary("gelu", dx)
    want, want_grad = (np.repeat(gpu.to_numpy(a)[:, None], 4, 1) for a in
                       (y, gpu.unary_backward("gelu", dx, y, gpu.from_numpy(np.ones_like(x)))))
    kernel = BlockedMatmul(gpu.rt, BlockConfig(32, 32, 16, 4, 4))
    column, ones = gpu.from_numpy(x.reshape(n, 1)), gpu.from_numpy(np.ones((1, 4), np.float32))
    out, pre = gpu.rt.empty((n, 4)), gpu.rt.empty((n, 4))
    kernel.record(column, ones, out, 1, n, 4, 1, False, False, False, Epilogue(activation="gelu", pre=pre))
    np.testing.assert_allclose(gpu.to_numpy(out), want, rtol=1e-6, atol=1e-37)  # (contracted or not)
    np.testing.assert_array_equal(gpu.to_numpy(pre), np.repeat(x[:, None], 4, 1))
    out = gpu.rt.empty((n, 4))
    kernel.record(gpu.from_numpy(np.ones((n, 1), np.float32)), ones, out, 1, n, 4, 1, False, False, False,
                  Epilogue(pre=gpu.from_numpy(np.repeat(x[:, None], 4, 1)), activation_grad="gelu"))
    np.testing.assert_allclose(gpu.to_numpy(out), want_grad, rtol=1e-6, atol=1e-37)


def test_variants_differing_only_in_group_run_their_own_kernels(gpu, rng):
    """The variant name leaves out `group`: the shader and pipeline caches key by the generated code."""
    a, b = rng.standard_normal((70, 40)).astype(np.float32), rng.standard_normal((40, 50)).astype(np.float32)
    da, db = gpu.from_numpy(a), gpu.from_numpy(b)
    pipelines = []
    for group in (1, 8):
        mm, out = BlockedMatmul(gpu.rt, BlockConfig(32, 32, 8, 4, 4, group=group)), gpu.rt.empty((70, 50))
        mm.record(da, db, out, 1, 70, 50, 40, False, False, False)
        np.testing.assert_allclose(gpu.to_numpy(out), a @ b, rtol=1e-4, atol=1e-4)
        pipelines.append(gpu.rt.kernels.pipeline(mm.modules[(False, False, False, False), False], "matmul_main"))
    assert pipelines[0] is not pipelines[1]
