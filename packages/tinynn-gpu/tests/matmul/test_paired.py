"""Two matmuls in one dispatch (PairedMatmul, the template's matmul_pair_main) against float64, outputs poisoned
with NaN: any two layouts, batches, split counts and epilogues, on shapes off the tile grid; then a linear layer's
backward through it (the backend's one user), its tuning, and a training step replayed with it."""
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinynn import backends
from tinynn_gpu.matmul.configs import PAIR_SPLITS, BlockConfig
from tinynn_gpu.matmul.problem import Epilogue
from tinynn_gpu.matmul.selection import SEPARATE, MatmulSelector
from tinynn_gpu.matmul.paired import PairedMatmul

from test_backend import CFG, captured_losses
from test_blocked import assert_matmul_result, epilogue_for, matmul_cases, operands, reference, rel_err

# blocks the H200's tuning pairs (small: lavapipe runs them on the CPU), one of each design: vec4 loads, double
# buffers, loads two tiles ahead, BK 32, 96 wide
TILES = (BlockConfig(32, 64, 16, 4, 4), BlockConfig(64, 64, 16, 8, 4, vec4=True, double=True, ahead=2),
         BlockConfig(32, 64, 32, 4, 4, vec4=True, double=True), BlockConfig(64, 96, 16, 8, 4, vec4=True, double=True))
splits = st.sampled_from(PAIR_SPLITS)


def drawn_problem(gpu, case, seed_mask):
    """A drawn case's operands on the GPU, its output and epilogue (only the epilogue parts seed_mask keeps:
    the two problems of a pair may not share one), and the check of its result."""
    batch, m, n, k, ta, tb, shared, seed = case
    case = (batch, m, n, k, ta, tb, shared, seed & seed_mask)
    a, b = operands(case)
    epilogue, expected = epilogue_for(case, gpu)
    arrays = (gpu.from_numpy(a), gpu.from_numpy(b), gpu.rt.empty((batch, m, n)), epilogue)

    def check():
        assert_matmul_result(gpu, arrays[2], epilogue, expected, a, b, ta, tb)
    return (batch, m, n, k, ta, tb, shared, epilogue), arrays, check


@pytest.mark.parametrize("tile", TILES, ids=lambda c: c.name)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=matmul_cases, second=matmul_cases, split=splits, split2=splits)
def test_two_matmuls_in_one_dispatch(poisoned, tile, first, second, split, split2):
    """The first problem draws bias, GELU or its gradient and a residual; the second row sums."""
    shape, arrays, check = drawn_problem(poisoned, first, ~8)
    shape2, arrays2, check2 = drawn_problem(poisoned, second, 8)
    PairedMatmul(poisoned.rt, tile, (split, split2)).plan(shape, shape2)(*arrays, *arrays2)
    check()
    check2()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 2), columns=st.integers(1, 2), steps=st.integers(1, 2), split=splits, split2=splits,
       seed=st.integers(0, 2**31))
def test_a_linear_layers_gradients_in_whole_tiles(poisoned, rows, columns, steps, split, split2, seed):
    """The backward's own pair (g @ W, g.T @ x with g's column sums) on shapes of whole tiles, where each problem
    loads without bounds checks (and vec4 loads run): the module's two layouts differ only there."""
    tile = TILES[1]
    # whole blocks, and K whole BK steps giving every split (1-4) work: 3 x 64 does for both sides
    m, n, k = 3 * tile.bm * rows, tile.bn * columns, 3 * tile.bm * steps
    case = (1, m, n, k, False, False, False, seed)
    shape, arrays, check = drawn_problem(poisoned, case, 16)  # GELU's gradient, or nothing
    g, weight = arrays[0], arrays[1]
    x = np.random.default_rng(seed).standard_normal((m, n)).astype(np.float32)
    g_bias = poisoned.rt.empty((k,))
    g_weight = poisoned.rt.empty((k, n))
    paired = PairedMatmul(poisoned.rt, tile, (split, split2))
    paired.plan(shape, (1, k, n, m, True, False, False, Epilogue(row_sums=g_bias)))(
        *arrays, g, poisoned.from_numpy(x), g_weight, Epilogue(row_sums=g_bias))
    assert all(layout[3] for layouts, _ in paired.modules for layout in layouts)  # aligned, both
    check()
    g64 = poisoned.to_numpy(g).astype(np.float64)[0]
    magnitude = np.linalg.norm(np.abs(g64).T @ np.abs(x))
    want = reference(g64[None], x[None], True, False)[0]
    assert np.linalg.norm(poisoned.to_numpy(g_weight) - want) <= 1e-5 * magnitude
    np.testing.assert_allclose(poisoned.to_numpy(g_bias), g64.sum(0), rtol=1e-5, atol=1e-5 * np.abs(g64).sum(0).max())


# K 100 in 2 splits gives a K chunk of 64, K 40 in 3 one of 16; K 20 in 2 one of 16, K 150 in 3 one of 64
@pytest.mark.parametrize("k, k2, swapped", [(100, 40, False), (20, 150, True)], ids=["in order", "swapped"])
@pytest.mark.parametrize("seed2", [1 | 2 | 4, 1 | 4 | 16], ids=["gelu", "gelu grad"])
@pytest.mark.parametrize("tile", TILES, ids=lambda c: c.name)
def test_the_row_sums_first_and_the_other_epilogue_second(poisoned, tile, k, k2, swapped, seed2):
    """The drawn test's roles the other way round: the first problem sums rows, the second has bias, GELU (or its
    gradient) and a residual; both split, batched, one with its b shared; in the given order and swapped (the
    second problem's longer K chunk goes first), which the plan must say it did."""
    shape, arrays, check = drawn_problem(poisoned, (2, 37, 70, k, True, False, True, 8), 8)
    shape2, arrays2, check2 = drawn_problem(poisoned, (2, 45, 19, k2, False, True, False, seed2), ~8)
    paired = PairedMatmul(poisoned.rt, tile, (2, 3))
    paired.plan(shape, shape2)(*arrays, *arrays2)
    assert [plan[0] for plan in paired.plans.values()] == [swapped]
    check()
    check2()


# N 52 and 20: both store quads; 52 and 19 (either first): one N off the quads, so the module stores floats for both
@pytest.mark.parametrize("n, n2", [(52, 20), (52, 19), (19, 52)])
@pytest.mark.parametrize("swapped", [False, True])
@pytest.mark.parametrize("seed2", [1 | 2 | 4, 1 | 4 | 16], ids=["gelu", "gelu grad"])
def test_a_pair_stores_quads_only_where_both_rows_start_on_quads(poisoned, n, n2, swapped, seed2):
    """Off the tile grid, batched, both split (the finishes a Value a thread), one b shared: the first problem sums
    rows, the second has bias, GELU's `pre` written (or read, for its gradient) and a residual; in the given order
    and swapped (K 20 in 2 splits is a chunk of 16, K 150 in 3 one of 64)."""
    tile = TILES[1]
    k, k2 = (150, 20) if not swapped else (20, 150)
    shape, arrays, check = drawn_problem(poisoned, (2, 37, n, k, True, False, True, 8), 8)
    shape2, arrays2, check2 = drawn_problem(poisoned, (2, 45, n2, k2, False, True, False, seed2), ~8)
    paired = PairedMatmul(poisoned.rt, tile, (3, 2) if not swapped else (2, 3))
    paired.plan(shape, shape2)(*arrays, *arrays2)
    assert [plan[0] for plan in paired.plans.values()] == [swapped]
    assert [quads for _, quads in paired.modules] == [n % 4 == 0 and n2 % 4 == 0]
    check()
    check2()


def test_a_pair_past_65535_workgroups(poisoned, rng):
    """A pair's grid is one flat count laid out as (65535, rows): the second problem's blocks straddle the row
    boundary. Both split and batched, the second with row sums."""
    tile = BlockConfig(32, 32, 8, 4, 4)
    batch, batch2, k = 9_000, 10_000, 32  # 36,000 + 40,000 workgroups: splits 4 of K chunk 8 each
    gpu = poisoned
    a, b = rng.standard_normal((batch, 1, k)).astype(np.float32), rng.standard_normal((batch, k, 2)).astype(np.float32)
    a2 = rng.standard_normal((batch2, k, 3)).astype(np.float32)  # stored K x M
    b2 = rng.standard_normal((batch2, k, 1)).astype(np.float32)
    out, out2, row_sums = gpu.rt.empty((batch, 1, 2)), gpu.rt.empty((batch2, 3, 1)), gpu.rt.empty((batch2, 3))
    paired = PairedMatmul(gpu.rt, tile, (4, 4))
    paired.plan((batch, 1, 2, k, False, False, False, Epilogue()),
                (batch2, 3, 1, k, True, False, False, Epilogue(row_sums=row_sums)))(
        gpu.from_numpy(a), gpu.from_numpy(b), out, Epilogue(), gpu.from_numpy(a2), gpu.from_numpy(b2), out2,
        Epilogue(row_sums=row_sums))
    (_, launch, _, _, _), = paired.plans.values()
    assert launch.groups == (65535, 2, 1)
    assert rel_err(gpu.to_numpy(out), reference(a, b, False, False)) <= 1e-5
    assert rel_err(gpu.to_numpy(out2), reference(a2, b2, True, False)) <= 1e-5
    assert rel_err(gpu.to_numpy(row_sums), a2.astype(np.float64).sum(-2)) <= 1e-5


def test_pairs_refuse_an_epilogue_array_both_would_use(gpu):
    both = Epilogue(row_sums=gpu.rt.empty((8,)))
    with pytest.raises(ValueError, match="only one may use row_sums"):
        PairedMatmul(gpu.rt, TILES[0], (1, 1)).plan((1, 8, 8, 8, False, False, False, both),
                                                   (1, 8, 8, 8, True, False, False, both))


@pytest.fixture
def paired(gpu, monkeypatch):
    """Every linear layer's gradients paired, as tuning picks them on a GPU where that is faster (lavapipe's
    default keeps them apart); the backend's plans and choices as they were afterwards."""
    monkeypatch.setattr(MatmulSelector, "default_pair", staticmethod(lambda first, second: PAIR))
    plans, choices = dict(gpu.matmul_plans), dict(gpu.mm.choices)
    gpu.matmul_plans.clear()  # plans and choices made before would keep the matmuls apart
    for key in [key for key in choices if key.startswith("pair")]:
        del gpu.mm.choices[key]
    yield gpu
    gpu.matmul_plans.clear()
    gpu.matmul_plans.update(plans)
    gpu.mm.choices.clear()
    gpu.mm.choices.update(choices)


PAIR = "paired 32x64x16/4x4 vec4 db 2+3"


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("has_bias", [True, False])
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.sampled_from([1, 2, 17, 64, 130]), ins=st.sampled_from([1, 5, 16, 33]),
       outs=st.sampled_from([1, 3, 32, 65]), seed=st.integers(0, 2**31))
def test_linear_backward_paired(poisoned, paired, activation, has_bias, rows, ins, outs, seed):
    """The backend's linear backward with its two matmuls paired, against the NumPy reference in float64."""
    gpu, cpu = poisoned, backends.reference()
    g = np.random.default_rng(seed)
    grad, x, weight, pre = (g.standard_normal(s).astype(np.float32)
                            for s in ((rows, outs), (rows, ins), (outs, ins), (rows, ins)))
    got = gpu.linear_backward(gpu.from_numpy(grad), gpu.from_numpy(x), gpu.from_numpy(weight), has_bias=has_bias,
                              x_activation=activation, x_pre=gpu.from_numpy(pre) if activation else None)
    assert gpu.mm.last.startswith("paired")
    want = cpu.linear_backward(*(a.astype(np.float64) for a in (grad, x, weight)), has_bias=has_bias,
                               x_activation=activation, x_pre=pre.astype(np.float64) if activation else None)
    scale = (np.abs(grad) @ np.abs(weight), np.abs(grad).T @ np.abs(x), np.abs(grad).sum(0))
    for name, actual, expected, size in zip(("x", "weight", "bias"), got, want, scale):
        if expected is None:
            assert actual is None
            continue
        actual = gpu.to_numpy(actual)
        assert np.isfinite(actual).all(), f"unwritten {name} gradient"
        assert np.linalg.norm(actual - expected) <= 1e-5 * max(np.linalg.norm(size), 1e-30), name


def test_linear_backward_paired_keeps_a_plan_per_epilogue(poisoned, paired):
    """One shape's backward with and without the bias gradient and GELU's gradient, one after another in one
    backend: each gets a pair planned for its own epilogue (the backend's key), none a plan made for another."""
    gpu, cpu = poisoned, backends.reference()
    g = np.random.default_rng(5)
    grad, x, weight, pre = (g.standard_normal(s).astype(np.float32) for s in ((70, 33), (70, 20), (33, 20), (70, 20)))
    for activation, has_bias in ((None, True), ("gelu", True), ("gelu", False), (None, False), (None, True)):
        got = gpu.linear_backward(gpu.from_numpy(grad), gpu.from_numpy(x), gpu.from_numpy(weight), has_bias=has_bias,
                                  x_activation=activation, x_pre=gpu.from_numpy(pre) if activation else None)
        assert gpu.mm.last.startswith("paired")
        want = cpu.linear_backward(*(a.astype(np.float64) for a in (grad, x, weight)), has_bias=has_bias,
                                   x_activation=activation, x_pre=pre.astype(np.float64) if activation else None)
        assert (got[2] is None) == (not has_bias)
        for actual, expected in zip(got, want):
            if expected is not None:
                np.testing.assert_allclose(gpu.to_numpy(actual), expected, rtol=1e-4, atol=1e-4)


def test_tuning_a_pair_times_it_against_the_two_apart_and_caches_the_winner(setting, gpu, tmp_path, monkeypatch, rng):
    setting("TINYNN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(MatmulSelector, "tune_min_macs", 0)
    tuner = MatmulSelector(gpu.rt, autotune=True)
    tuner.candidates = tuner.candidates[:2]  # lavapipe times on the CPU: a few of each kind
    tuner.pair_candidates = dict(list(tuner.pair_candidates.items())[:3])
    rows, ins, outs = 40, 24, 12
    grad, x, weight = (gpu.from_numpy(rng.standard_normal(s).astype(np.float32))
                       for s in ((rows, outs), (rows, ins), (outs, ins)))
    g_bias = gpu.rt.empty((outs,))
    first = (grad, weight, gpu.rt.empty((rows, ins)), 1, rows, ins, outs, False, False, False, Epilogue())
    second = (grad, x, gpu.rt.empty((outs, ins)), 1, outs, ins, rows, True, False, False, Epilogue(row_sums=g_bias))
    tuner.plan_pair(first, second)
    key = f"pair ta=0 tb=0 shared=0 b=1 m={rows} n={ins} k={outs} + ta=1 tb=0 shared=0 b=1 m={outs} n={ins} k={rows}"
    cached = json.loads((tmp_path / "matmul-autotune.json").read_text())["choices"][tuner.cache_key]
    assert cached[key] == tuner.choices[key] and cached[key] in (SEPARATE, *tuner.pair_candidates)
    # each matmul alone was tuned first (the pair's rival), and cached beside it
    assert {k for k in cached if not k.startswith("pair")} == {
        f"ta=0 tb=0 shared=0 b=1 m={rows} n={ins} k={outs}", f"ta=1 tb=0 shared=0 b=1 m={outs} n={ins} k={rows}"}

    again = MatmulSelector(gpu.rt, autotune=True)
    monkeypatch.setattr(again, "_tune", lambda *args: pytest.fail("the cached choice should have been used"))
    record = again.plan_pair(first, second)
    assert (record is None) == (cached[key] == SEPARATE)


def test_a_forced_variant_keeps_matmuls_apart(setting, paired, monkeypatch, rng):
    gpu = paired
    setting("TINYNN_MATMUL", "lesson8")
    arrays = [gpu.from_numpy(rng.standard_normal((8, 8)).astype(np.float32)) for _ in range(3)]
    problem = (*arrays, 1, 8, 8, 8, False, False, False, Epilogue())
    assert MatmulSelector(gpu.rt).plan_pair(problem, problem) is None


def test_a_replayed_training_step_with_paired_gradients(paired, monkeypatch):
    """A captured two-layer step whose linear layers' gradients are paired: its replays compute what the same
    steps compute eagerly, and follow the NumPy backend's losses."""
    gpu = paired
    replayed, step = captured_losses(gpu, 12)
    assert step._run.tape is not None and step._run.eager_reason is None
    assert sum(event[0] == "dispatch" and event[1] is pipeline for event in step._run.tape.events
               for pipeline in paired_pipelines(gpu)) == 4 * CFG.n_layer + 1  # every linear layer, and the head
    monkeypatch.setattr(gpu, "capture", lambda fn, key=None: fn)
    eager, _ = captured_losses(gpu, 12)
    monkeypatch.undo()
    assert replayed == eager
    np.testing.assert_allclose(replayed, captured_losses(backends.reference(), 12)[0], rtol=1e-3)


def paired_pipelines(gpu):
    return {pipe for shader in gpu.rt.kernels.shaders.values() if shader.label.startswith("matmul pair")
            for entry, pipe in shader.pipelines.items() if entry == "matmul_pair_main"}


@pytest.mark.parametrize("split, split2, dispatches", [(1, 1, 1), (2, 1, 2), (1, 3, 2), (2, 3, 2)])
def test_a_pairs_finishes_are_one_dispatch(gpu, split, split2, dispatches):
    """Where both problems are split, matmul_pair_finish_main finishes both: the pair and one finish. (Unpoisoned:
    poisoning the split slices would count its fills.)"""
    shape, arrays, check = drawn_problem(gpu, (1, 37, 70, 100, True, False, False, 8), 8)
    shape2, arrays2, check2 = drawn_problem(gpu, (1, 45, 20, 150, False, True, False, 1 | 4 | 16), ~8)
    record = PairedMatmul(gpu.rt, TILES[1], (split, split2)).plan(shape, shape2)
    before = gpu.rt.counters["dispatches"]
    record(*arrays, *arrays2)
    assert gpu.rt.counters["dispatches"] - before == dispatches
    check()
    check2()
