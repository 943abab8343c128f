"""The fused attention kernels against the float64 NumPy reference, every output poisoned (NaN) first.
Shapes are drawn by hypothesis: T off the tile grid and T = 1, head sizes 16 to 128 (multiples of 4, not
only powers of two), batch 1. Each runs with subgroup lanes (where the adapter has them) and with one thread
per row. The forward is the tiled kernel (every tile of TILES that fits the adapter) and, forced, the per-row
one (every layout); the backward likewise (BACKWARD_TILES and more tiles, and the per-row kernels). Bounds
are relative (Frobenius) errors; fp32 kernels measured ~3e-7 here."""
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tinynn import backends
from tinynn.errors import TinynnError
from tinynn_gpu.ops.attention import LAYOUTS, lane_sum_body, lanes_for, workgroup_bytes
from tinynn_gpu.ops.attention_backward_tiled import BACKWARD_TILES, BackwardTile, choose_backward_tile
from tinynn_gpu.ops.attention_tiled import TILES, Tile, choose_tile

RTOL_FORWARD = 1e-5  # y and lse
RTOL_BACKWARD = 2e-5  # g_qkv: one more recomputation of the probabilities

seq_lens = st.one_of(st.integers(1, 70), st.sampled_from([1, 8, 15, 16, 17, 31, 32, 33]))
# each head size compiles its own unrolled kernels (seconds each on lavapipe): a few, not a power of two among them
head_sizes = st.sampled_from([16, 20, 64, 128])


def rel_err(actual, expected, floor=1e-30):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    assert np.isfinite(actual).all(), "unwritten (NaN) or non-finite elements"
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), floor))


def check_against_reference(gpu, batch, seq, n_head, head_size, seed, backward=True):
    g = np.random.default_rng(seed)
    qkv = (2 * g.standard_normal((batch, seq, 3 * n_head * head_size))).astype(np.float32)
    grad = g.standard_normal((batch, seq, n_head * head_size)).astype(np.float32)
    scale = head_size ** -0.5
    ref = backends.reference()
    y_ref, lse_ref = ref.attention_forward(qkv.astype(np.float64), n_head, scale)
    d_qkv = gpu.from_numpy(qkv)
    y, lse = gpu.attention_forward(d_qkv, n_head, scale)
    assert rel_err(gpu.to_numpy(y), y_ref) <= RTOL_FORWARD
    # lse near 0 (T = 1: one score, often a cancelling dot product) has no relative precision; an error e in it
    # scales the probabilities by exp(e): so at least 1 per element
    assert rel_err(gpu.to_numpy(lse), lse_ref, floor=np.sqrt(lse_ref.size)) <= RTOL_FORWARD
    if backward:
        g_ref = ref.attention_backward(grad.astype(np.float64), qkv.astype(np.float64), y_ref, lse_ref, n_head,
                                       scale)
        g_qkv = gpu.attention_backward(gpu.from_numpy(grad), d_qkv, y, lse, n_head, scale)
        assert rel_err(gpu.to_numpy(g_qkv), g_ref) <= RTOL_BACKWARD


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 2), seq=seq_lens, n_head=st.integers(1, 3), head_size=head_sizes,
       seed=st.integers(0, 2**31))
@example(batch=1, seq=1, n_head=1, head_size=128, seed=0)
@example(batch=1, seq=33, n_head=2, head_size=16, seed=1)
@example(batch=1, seq=1, n_head=1, head_size=16, seed=2740)  # lse = -0.0106: 1.7e-5 relative, 1.7e-7 absolute
# more query blocks than heads, and more heads than query blocks: a grid whose dimensions were swapped, or a kernel
# that read a block or head from the other one, leaves rows unwritten (NaN) or writes them wrong
@example(batch=1, seq=70, n_head=1, head_size=64, seed=3)
@example(batch=2, seq=17, n_head=3, head_size=20, seed=4)
def test_attention_matches_the_reference(subgroup_path, batch, seq, n_head, head_size, seed):
    fallbacks = sum(subgroup_path.fallbacks.values())
    check_against_reference(subgroup_path, batch, seq, n_head, head_size, seed)
    assert sum(subgroup_path.fallbacks.values()) == fallbacks, "the kernels refused a supported head size"


# (2, 4) with head size 40: two lanes a row, so four threads a split, and several splits in one subgroup
# (lavapipe's are 8 wide), whose loops take the same steps; lavapipe ran the earlier, non-uniform loops right
# too: that they are uniform is Tint's check (test_wgsl_tint.py)
@pytest.mark.parametrize("layout", LAYOUTS + ((16, 4), (2, 4)), ids=lambda t: f"{t[0]}x{t[1]}")
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=seq_lens, seed=st.integers(0, 2**31))
@example(seq=70, seed=0)  # more query blocks (9 of 8 rows) than its two heads
def test_every_layout(setting, subgroup_path, monkeypatch, layout, seq, seed):
    """The per-row kernels, their forward included; head size 40: two lanes a row on the subgroup path."""
    if workgroup_bytes(40, *layout) > subgroup_path.attention.max_bytes:
        pytest.skip(f"layout {layout} needs more workgroup memory than this adapter has")
    setting("TINYNN_ATTENTION_LAYOUT", f"{layout[0]}x{layout[1]}")
    setting("TINYNN_ATTENTION_TILE", "0")
    setting("TINYNN_ATTENTION_BACKWARD_TILE", "0")
    check_against_reference(subgroup_path, 1, seq, 2, 40, seed)


@pytest.mark.parametrize("head_size", [16, 64, 128])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 2), seq=seq_lens, n_head=st.integers(1, 2), seed=st.integers(0, 2**31))
def test_the_per_row_backward(setting, subgroup_path, monkeypatch, head_size, batch, seq, n_head, seed):
    """The per-row backward at head sizes where the tiled one runs by default."""
    setting("TINYNN_ATTENTION_BACKWARD_TILE", "0")
    check_against_reference(subgroup_path, batch, seq, n_head, head_size, seed)


# beyond BACKWARD_TILES: one that fits head size 64 in lavapipe's 32 KiB with more threads, and one that fits
# head size 128 there
EXTRA_BACKWARD_TILES = (BackwardTile(32, 16, 2), BackwardTile(16, 8, 1))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 2), seq=seq_lens, n_head=st.integers(1, 2), data=st.data())
def test_every_backward_tile(setting, subgroup_path, monkeypatch, batch, seq, n_head, data):
    """The tiled backward with each tile that fits this adapter (the H200's 32x32x2 needs 44.7 KB: on lavapipe's
    32 KiB it is refused, and the tiles beside it run), at one of the head sizes it fits."""
    max_bytes = subgroup_path.attention.max_bytes
    runs = [(tile, hs) for tile in BACKWARD_TILES + EXTRA_BACKWARD_TILES for hs in (32, 64, 128)
            if not tile.check(hs, max_bytes)]
    tile, head_size = data.draw(st.sampled_from(runs), label="tile, head size")
    setting("TINYNN_ATTENTION_BACKWARD_TILE", str(tile))
    check_against_reference(subgroup_path, batch, seq, n_head, head_size, data.draw(st.integers(0, 2**31)))

@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 2), seq=st.integers(200, 300), n_head=st.integers(1, 2), seed=st.integers(0, 2**31))
def test_the_backward_stays_on_the_gpu_where_the_dq_slices_exceed_a_binding(poisoned, monkeypatch, batch, seq,
                                                                             n_head, seed):
    """The tiled backward's dQ slices grow as T^2 / KEYS, the per-row kernels' delta as T: where the slices
    would not fit one storage binding (and everything else does), the per-row kernels run, not NumPy."""
    head_size = 64
    tile = choose_backward_tile(head_size, poisoned.attention.max_bytes)
    if tile is None:
        pytest.skip(f"no backward tile fits head size {head_size} here")
    slices = 4 * tile.part_floats(batch, seq, n_head, head_size)
    largest = 4 * batch * seq * 3 * n_head * head_size  # qkv and its gradient
    assert largest < slices - 4
    monkeypatch.setattr(poisoned.rt, "max_binding", slices - 4)
    fallbacks = sum(poisoned.fallbacks.values())
    check_against_reference(poisoned, batch, seq, n_head, head_size, seed)
    assert sum(poisoned.fallbacks.values()) == fallbacks, "the backward ran on the CPU"



def test_backward_tile_choice(setting, monkeypatch):
    """The first tile of BACKWARD_TILES that fits the head size and workgroup memory; none: the per-row kernels."""
    assert choose_backward_tile(64, 49152) == BACKWARD_TILES[0] and choose_backward_tile(64, 32768) == (16, 16, 1)
    assert choose_backward_tile(32, 49152) == (32, 32, 4) and choose_backward_tile(128, 49152) == (16, 16, 1)
    assert choose_backward_tile(128, 32768) is None  # the per-row kernels
    assert choose_backward_tile(20, 49152) is None and choose_backward_tile(16, 49152) is None  # no even split
    setting("TINYNN_ATTENTION_BACKWARD_TILE", "0")
    assert choose_backward_tile(64, 49152) is None
    setting("TINYNN_ATTENTION_BACKWARD_TILE", "32x24x2")
    with pytest.raises(TinynnError, match="TINYNN_ATTENTION_BACKWARD_TILE"):
        choose_backward_tile(64, 49152)


@pytest.mark.parametrize("tile", TILES, ids=str)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 2), seq=seq_lens, n_head=st.integers(1, 2), head_size=head_sizes,
       seed=st.integers(0, 2**31))
def test_every_tile(setting, subgroup_path, monkeypatch, tile, batch, seq, n_head, head_size, seed):
    """The tiled forward with each tile, at head sizes it fits here (the default tile's are the first test's)."""
    assume(not tile.check(head_size, subgroup_path.attention.max_bytes))
    setting("TINYNN_ATTENTION_TILE", str(tile))
    check_against_reference(subgroup_path, batch, seq, n_head, head_size, seed, backward=False)


def test_tile_choice(setting, monkeypatch):
    """The first tile of TILES that fits the workgroup memory, passed over where another pads the head's vec4
    columns less (a row of 16 threads over head size 32's 8 columns); none: the per-row forward."""
    assert choose_tile(64, 49152) == TILES[0] and choose_tile(128, 49152) == Tile(32, 32, 2)
    assert choose_tile(128, 32768) == Tile(16, 32, 2) and choose_tile(64, 16384) is None
    assert choose_tile(32, 49152) == choose_tile(16, 49152) == Tile(64, 32, 4)  # 8 threads a row, not 16
    setting("TINYNN_ATTENTION_TILE", "64x32x2")  # well formed (settings.py refuses a misspelt one) but too big
    with pytest.raises(TinynnError, match="TINYNN_ATTENTION_TILE=64x32x2: "):
        choose_tile(64, 16384)


def test_the_forward_follows_the_tile_setting_of_the_moment(setting, gpu, monkeypatch):
    """The forward's shader is chosen once per head size and TINYNN_ATTENTION_TILE, so a change of the
    variable on a live backend still takes effect (tests and experiments/attention_tiles.py rely on it)."""
    attention = gpu.attention
    if choose_tile(16, attention.max_bytes) is None or TILES[-1].check(16, attention.max_bytes):
        pytest.skip("the adapter's workgroup memory fits no tile")
    tiled, tile = attention._tiled_shader(16)
    assert tiled is not None and tile == choose_tile(16, attention.max_bytes)
    setting("TINYNN_ATTENTION_TILE", "0")
    assert attention._tiled_shader(16) == (None, None)
    setting("TINYNN_ATTENTION_TILE", str(TILES[-1]))
    assert attention._tiled_shader(16)[1] == TILES[-1]
    setting("TINYNN_ATTENTION_TILE", None)
    assert attention._tiled_shader(16) == (tiled, tile)


def test_lanes_split_rows_evenly():
    assert [lanes_for(hs, subgroups=True) for hs in (16, 20, 40, 64, 128)] == [4, 1, 2, 4, 4]
    assert lanes_for(64, subgroups=False) == 1
    assert "subgroup" not in lane_sum_body(1) and lane_sum_body(4).count("subgroupShuffleXor") == 2


def test_unsupported_head_size_runs_the_reference(poisoned, monkeypatch):
    monkeypatch.setattr(poisoned, "fallbacks", Counter())  # the session's backend: other tests count on it
    check_against_reference(poisoned, 2, 5, 2, 6, seed=0)
    assert poisoned.fallbacks == Counter({"attention_forward": 1, "attention_backward": 1})


def test_the_per_row_kernels_take_their_lanes_from_the_runtime(setting, gpu, monkeypatch):
    """The runtime reads TINYNN_SUBGROUPS once (Runtime.subgroups): without subgroups the per-row kernels give a row
    one thread, and compute what the reference does; with no tile forced, the tiled backward is the default where
    a tile fits."""
    n_head, head_size = 2, 16
    monkeypatch.setattr(gpu.rt, "subgroups", False)
    setting("TINYNN_ATTENTION_LAYOUT", "8x4")
    setting("TINYNN_ATTENTION_TILE", "0")
    setting("TINYNN_ATTENTION_BACKWARD_TILE", "0")
    shader, rows = gpu.attention._shader(head_size)
    assert rows == 8 and shader.label.endswith(" 8x4x1"), shader.label
    assert gpu.attention._backward_plan((2, 9, 3 * n_head * head_size), n_head) == (None, None)
    check_against_reference(gpu, 2, 9, n_head, head_size, seed=0)
    setting("TINYNN_ATTENTION_BACKWARD_TILE", None)
    tile = choose_backward_tile(head_size, gpu.attention.max_bytes)
    assert gpu.attention._backward_plan((2, 9, 3 * n_head * head_size), n_head)[1] == tile


def test_more_heads_than_a_dispatch_dimension_holds(poisoned, monkeypatch):
    """batch x n_head past the 65535 workgroups of a dispatch dimension (each kernel's grid has a row of
    workgroups per head): the NumPy reference, not a validation error that takes the recorded work with it."""
    monkeypatch.setattr(poisoned, "fallbacks", Counter())  # the session's backend: other tests count on it
    check_against_reference(poisoned, 32_800, 1, 2, 32, seed=0)  # 65,600 heads
    poisoned.sync()
