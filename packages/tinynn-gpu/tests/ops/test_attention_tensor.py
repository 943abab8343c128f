"""The tensor-core attention forward and backward of matmul precision "high" (ops/attention_tensor.py,
ops/attention_tensor_backward.py) against the float64 NumPy reference, every output poisoned (NaN) first. Where
the device has f16 subgroup matrices (an NVIDIA GPU on Dawn) the backend's attention runs on them, within f16's
rounding (the float32 backward where no backward tile takes the head size); elsewhere (lavapipe) "high" attention
runs the float32 kernels and these tests check that it does, bit for bit. (Where both can run a shape, which
one does is timed, test_attention_choice.py; here the tensor-core kernels are chosen.) Everywhere, the same kernels
with their matrix products written out in plain WGSL (`emulate`) run every tile and every head size that fit the
adapter (`emulation_runs`): their staging, range scales, softmax, masking and stores are the tensor-core kernels'
own.
Magnitudes far outside f16's range (6e-8 to 65504) check the range scales: without them the results overflow or
lose their digits. The first-use check (ops/attention_tensor_check.py) runs on the emulated kernels, right and
broken."""
import numpy as np
import pytest

from tinynn import backends, precision
from tinynn.errors import TinynnNotice
from tinynn_gpu.ops import attention_tensor, attention_tensor_backward
from tinynn_gpu.ops.attention_choice import TENSOR, AttentionChoice, key
from tinynn_gpu.ops.attention_tensor import TENSOR_TILES, TensorAttention, TensorTile, choose_tensor_tile
from tinynn_gpu.ops.attention_tensor_backward import (BACKWARD_TENSOR_TILES, BackwardTensorTile, TensorBackward,
                                                      choose_backward_tensor_tile)

RTOL_Y = 1.5e-3  # relative (Frobenius) error of y; f16's 10-bit mantissa, measured ~3e-4 in the emulation
RTOL_ROW = 1e-2  # of any one row of y
ATOL_LSE = 3e-3  # of the logsumexp, relative to max(1, |lse|)
RTOL_BACKWARD = 5e-3  # each of dq, dk and dv; ~6e-4 in the emulated backward
RTOL_TERMS = 1e-3  # each of them against the size of its terms

# (batch, T, n_head, head size, magnitudes of q, k and v): T off the tile grid, head sizes padded to whole matrices
# (20, 48) and not (64, 128): a head size is a kernel of its own, each run on every tile that takes it
BASIC = {
    20: (1, 70, 1, 20, (1, 1, 1)),
    48: (1, 33, 2, 48, (1, 1, 1)),
    64: (2, 17, 2, 64, (1, 1, 1)),
    128: (1, 40, 1, 128, (1, 1, 1)),
}
# on one tile each: T = 1, a long T (GPT-2's 1024 where tensor cores run it fast, 256 in the emulation), and
# magnitudes far out; q k^T stays near 1 where q and k lie far out, so that the softmax, not f16, sets how much an
# error in a score matters
RANGE = [
    (1, 50, 1, 64, (1e-3, 1e3, 1e-3)),
    (1, 50, 1, 64, (1e3, 1e-3, 1e3)),
    (1, 50, 1, 64, (1e5, 1e-5, 1e-6)),  # f16 overflows q and holds v to a few bits
    (1, 50, 1, 64, (1e-6, 1e6, 1e5)),
]
EXTRA = [(1, 1, 1, 64, (1, 1, 1)), (1, 256, 1, 64, (1, 1, 1))] + RANGE
CASES = list(BASIC.values()) + [(1, 1, 1, 64, (1, 1, 1)), (1, 1024, 1, 64, (1, 1, 1))] + RANGE


def case_id(case) -> str:
    b, t, n, hs, mags = case
    return f"B{b}-T{t}-nh{n}-hs{hs}-{'x'.join(f'{m:g}' for m in mags)}"


ids = [case_id(case) for case in CASES]


PREFERRED = (64, 128, 20, 48)  # a tile on its own runs the first of these head sizes it takes here


def emulation_runs(tiles):
    """(tile, case), one of them None: each tile once, at the first head size of PREFERRED it takes here; each
    head size's basic case and each extra case on the first tile of `tiles` that takes it here (the one a device
    with tensor cores chooses, where it fits). So every tile and every head size runs on each adapter, where
    they fit, and lavapipe compiles a few kernels (minutes each in the emulation), not every pair."""
    runs = [(tile, None) for tile in tiles] + [(None, case) for case in list(BASIC.values()) + EXTRA]
    return pytest.mark.parametrize("tile, case", runs, ids=[f"{tile}-preferred" if case is None else
                                                            f"first-{case_id(case)}" for tile, case in runs])


def fitting(kernel, tiles, tile, case, choose):
    """The (tile, case) to run on this adapter (`emulation_runs`), or (None, None) where none fits: then what
    the adapter does instead is checked, that `choose` (the kernel's choice of tile) never takes that tile, or
    takes none for that head size ("high" attention then runs in float32). lavapipe's 32 KiB of workgroup
    memory holds neither the largest tiles' f32 emulation nor head size 128's."""
    half = 2 if kernel.f16 else 4
    if case is None:
        head_size = next((hs for hs in PREFERRED if not tile.check(hs, kernel.max_bytes, half)), None)
        if head_size is None:
            assert all(choose(hs, kernel.max_bytes, half) != tile for hs in range(4, 257, 4))
            return None, None
        return tile, BASIC[head_size]
    tile = next((t for t in tiles if not t.check(case[3], kernel.max_bytes, half)), None)
    if tile is None:
        assert choose(case[3], kernel.max_bytes, half) is None
    return tile, case if tile else None


def make_qkv(batch, seq, n_head, head_size, magnitudes, seed=0):
    g = np.random.default_rng(seed)
    qkv = g.standard_normal((batch, seq, 3, n_head * head_size))  # (B, T, 3, C)
    qkv *= np.array(magnitudes)[:, None]
    return qkv.reshape(batch, seq, 3 * n_head * head_size).astype(np.float32)


def check_forward(y, lse, qkv, n_head, label):
    """y (B, T, C) and lse (B, nh, T) against the float64 reference: the whole of y, each row of y, and each
    logsumexp, naming the worst row."""
    batch, seq, c3 = qkv.shape
    head_size = c3 // 3 // n_head
    y_ref, lse_ref = backends.reference().attention_forward(qkv.astype(np.float64), n_head, head_size ** -0.5)
    assert np.isfinite(y).all(), f"{label}: y has unwritten (NaN) or non-finite elements at " \
                                 f"{np.argwhere(~np.isfinite(y))[:5].tolist()} (batch, t, column)"
    assert np.isfinite(lse).all(), f"{label}: lse has unwritten (NaN) or non-finite elements at " \
                                   f"{np.argwhere(~np.isfinite(lse))[:5].tolist()} (batch, head, t)"
    err = np.linalg.norm(y - y_ref) / np.linalg.norm(y_ref)
    assert err <= RTOL_Y, f"{label}: y's relative error {err:.2e} > {RTOL_Y:g}"
    y_rows, ref_rows = y.reshape(batch, seq, n_head, head_size), y_ref.reshape(batch, seq, n_head, head_size)
    row_err = np.linalg.norm(y_rows - ref_rows, axis=-1) / np.linalg.norm(ref_rows, axis=-1)
    worst = np.unravel_index(np.argmax(row_err), row_err.shape)
    assert row_err[worst] <= RTOL_ROW, f"{label}: y's row (batch, t, head) {tuple(map(int, worst))} is off by " \
                                       f"{row_err[worst]:.2e} relative > {RTOL_ROW:g}"
    lse_err = np.abs(lse - lse_ref) / np.maximum(1.0, np.abs(lse_ref))
    worst = np.unravel_index(np.argmax(lse_err), lse_err.shape)
    assert lse_err[worst] <= ATOL_LSE, f"{label}: lse at (batch, head, t) {tuple(map(int, worst))} is " \
                                       f"{lse[worst]:.6g}, not {lse_ref[worst]:.6g}"
    return y_ref, lse_ref


@pytest.fixture
def high(poisoned):
    """The poisoned backend with matmul precision "high" for the test."""
    precision.set_matmul_precision("high")
    yield poisoned
    precision.set_matmul_precision(None)


def emulation_tiles():
    """Every tile of TENSOR_TILES, and smaller ones that fit lavapipe's 32 KiB of workgroup memory."""
    return TENSOR_TILES + (TensorTile(32, 32, 64), TensorTile(16, 16, 32))


@emulation_runs(emulation_tiles())
def test_emulated_products(poisoned, tile, case):
    """The kernel with its products in plain WGSL, each tile at each head size it fits here."""
    gpu = poisoned
    kernel = TensorAttention(gpu.rt, emulate=True)
    tile, case = fitting(kernel, emulation_tiles(), tile, case, choose_tensor_tile)
    if tile is None:
        return
    batch, seq, n_head, head_size, _ = case
    qkv = make_qkv(*case)
    y, lse = gpu.rt.empty((batch, seq, n_head * head_size)), gpu.rt.empty((batch, n_head, seq))
    kernel.forward(gpu.from_numpy(qkv), y, lse, n_head, head_size ** -0.5, tile)
    check_forward(gpu.to_numpy(y), gpu.to_numpy(lse), qkv, n_head, f"emulated {tile}")


def test_emulation_runs_here(poisoned):
    """The tiles left out above leave every adapter some: the smallest fits head size 64 in 32 KiB even in f32."""
    kernel = TensorAttention(poisoned.rt, emulate=True)
    assert not TensorTile(16, 16, 32).check(64, min(kernel.max_bytes, 32768), 4)


def gradient_terms(qkv, grad, lse, n_head):
    """The size of the terms each of dq, dk and dv adds up, (B, T, nh, hs) each: dS's from f16's dP (P |dO| |V|^T)
    and its own, times |K| or |Q|; P^T |dO|. A rounding error is measured against it where the sum cancels."""
    batch, seq, c3 = qkv.shape
    head_size = c3 // 3 // n_head
    scale = head_size ** -0.5
    q, k, v = qkv.astype(np.float64).reshape(batch, seq, 3, n_head, head_size).transpose(2, 0, 3, 1, 4)
    # q, k, v: (B, nh, T, hs)
    g = grad.astype(np.float64).reshape(batch, seq, n_head, head_size).transpose(0, 2, 1, 3)
    p = np.where(np.tril(np.ones((seq, seq), bool)), np.exp(scale * q @ k.swapaxes(-1, -2) - lse[..., None]), 0.0)
    dp = g @ v.swapaxes(-1, -2)  # (B, nh, T, T)
    ds = p * (abs(g) @ abs(v).swapaxes(-1, -2) + abs(dp - (p * dp).sum(-1, keepdims=True)))
    terms = (scale * ds @ abs(k), scale * ds.swapaxes(-1, -2) @ abs(q), p.swapaxes(-1, -2) @ abs(g))
    return [t.transpose(0, 2, 1, 3) for t in terms]


def check_backward(g_qkv, g_ref, terms, label):
    """Each of dq, dk and dv on its own scale (the range tests' differ by many orders): relative to itself, and
    everywhere relative to the size of its terms (`gradient_terms`), which also covers where it cancels to 0:
    dS = P (dP - delta) of a query that sees one key (dq's first row; dq and dk at T = 1), whose f16 dP leaves a
    little of delta's float32."""
    assert np.isfinite(g_qkv).all(), f"{label}: g_qkv has unwritten (NaN) or non-finite elements at " \
                                     f"{np.argwhere(~np.isfinite(g_qkv))[:5].tolist()} (batch, t, column)"
    seq = g_qkv.shape[1]
    for i, name in enumerate(("dq", "dk", "dv")):
        got, want = (x.reshape(*x.shape[:2], 3, -1)[:, :, i] for x in (g_qkv, g_ref))  # (B, T, 3, C)
        err = np.linalg.norm(got - want) / max(np.linalg.norm(terms[i]), 1e-30)
        assert err <= RTOL_TERMS, f"{label}: {name}'s error {err:.2e} of its terms' size > {RTOL_TERMS:g}"
        rows = slice(1 if name == "dq" else 0, None)
        if name == "dv" or seq > 1:
            got, want = got[:, rows], want[:, rows]
            err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
            assert err <= RTOL_BACKWARD, f"{label}: {name}'s relative error {err:.2e} > {RTOL_BACKWARD:g}"


def backward_emulation_tiles():
    """Every tile of BACKWARD_TENSOR_TILES, and smaller ones that fit lavapipe's 32 KiB of workgroup memory."""
    return BACKWARD_TENSOR_TILES + (BackwardTensorTile(16, 32, 64), BackwardTensorTile(16, 16, 32))


@emulation_runs(backward_emulation_tiles())
def test_emulated_backward(poisoned, tile, case):
    """The backward with its products in plain WGSL, from the reference's y and logsumexp, each tile at each head
    size it fits here."""
    gpu = poisoned
    kernel = TensorBackward(gpu.rt, emulate=True)
    tile, case = fitting(kernel, backward_emulation_tiles(), tile, case, choose_backward_tensor_tile)
    if tile is None:
        return
    batch, seq, n_head, head_size, _ = case
    qkv = make_qkv(*case)
    grad = np.random.default_rng(1).standard_normal((batch, seq, n_head * head_size))
    scale = head_size ** -0.5
    ref = backends.reference()
    y_ref, lse_ref = ref.attention_forward(qkv.astype(np.float64), n_head, scale)
    g_ref = ref.attention_backward(grad, qkv.astype(np.float64), y_ref, lse_ref, n_head, scale)
    g_qkv = gpu.rt.empty(qkv.shape)
    arrays = (gpu.from_numpy(x.astype(np.float32)) for x in (grad, qkv, y_ref, lse_ref))
    kernel.backward(*arrays, g_qkv, n_head, scale, tile)
    check_backward(gpu.to_numpy(g_qkv), g_ref, gradient_terms(qkv, grad, lse_ref, n_head),
                   f"emulated backward {tile}")


def choose(gpu, monkeypatch, case, path=TENSOR):
    """The case's choice of kernels in "high" (ops/attention_choice.py) made as if timed: `path`, both ways."""
    batch, seq, n_head, head_size, _ = case
    for direction in ("forward", "backward"):
        monkeypatch.setitem(gpu.mm.choices, key(direction, (batch, seq, 3 * n_head * head_size), n_head), path)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_high_attention(high, monkeypatch, case):
    """With tensor cores, "high" runs the tensor-core forward (its shader compiled for the head size) within f16's
    rounding, and the tensor-core backward where a tile takes the head size (else the float32 one) over its y and
    logsumexp within a little more; without, "high" attention is the float32 kernels' exactly, and no tensor-core
    kernel is compiled."""
    gpu = high
    batch, seq, n_head, head_size, _ = case
    qkv = make_qkv(*case)
    grad = np.random.default_rng(1).standard_normal((batch, seq, n_head * head_size)).astype(np.float32)
    scale = head_size ** -0.5
    choose(gpu, monkeypatch, case)
    d_qkv = gpu.from_numpy(qkv)
    y, lse = gpu.attention_forward(d_qkv, n_head, scale)
    g_qkv = gpu.to_numpy(gpu.attention_backward(gpu.from_numpy(grad), d_qkv, y, lse, n_head, scale))
    y, lse = gpu.to_numpy(y), gpu.to_numpy(lse)
    usable, why = gpu.mm.tensor_cores()
    compiled = {hs for hs, _ in gpu.attention.tensor.shaders}
    compiled_backward = {hs for hs, _ in gpu.attention.tensor_backward.shaders}
    if not usable:
        assert why and head_size not in compiled and head_size not in compiled_backward
        precision.set_matmul_precision("highest")
        y32, lse32 = gpu.attention_forward(d_qkv, n_head, scale)
        g32 = gpu.attention_backward(gpu.from_numpy(grad), d_qkv, y32, lse32, n_head, scale)
        np.testing.assert_array_equal(y, gpu.to_numpy(y32))
        np.testing.assert_array_equal(lse, gpu.to_numpy(lse32))
        np.testing.assert_array_equal(g_qkv, gpu.to_numpy(g32))
        return
    assert head_size in compiled, f"head size {head_size} did not run on the tensor-core forward"
    backward_runs = gpu.attention.tensor_backward.tile(qkv.shape, n_head) is not None
    assert (head_size in compiled_backward) == backward_runs, f"head size {head_size}: tensor-core backward " \
                                                              f"expected {backward_runs}"
    y_ref, lse_ref = check_forward(y, lse, qkv, n_head, "tensor cores")
    g_ref = backends.reference().attention_backward(grad.astype(np.float64), qkv.astype(np.float64), y_ref, lse_ref,
                                                    n_head, scale)
    check_backward(g_qkv, g_ref, gradient_terms(qkv, grad, lse_ref, n_head),
                   "tensor cores" if backward_runs else "float32 after the tensor-core forward")


def test_tile_choice():
    """64 queries a workgroup where the head fits 48 KiB, 32 up to head size 128; none where no tile splits the
    padded head evenly or fits (the float32 forward runs then)."""
    assert choose_tensor_tile(64, 49152) == TensorTile(64, 32) and choose_tensor_tile(20, 49152) == TensorTile(64, 32)
    assert choose_tensor_tile(128, 49152) == TensorTile(32, 32)
    assert choose_tensor_tile(80, 49152) is None  # 5 matrices of head: too wide for 64 queries, odd for 2 x 2
    assert choose_tensor_tile(128, 32768) is None


def test_backward_tile_choice():
    """32 keys and 32 queries at head sizes whose padded head splits over 4 subgroups and fits 48 KiB; else none."""
    assert choose_backward_tensor_tile(64, 49152) == BackwardTensorTile(32, 32)
    assert choose_backward_tensor_tile(20, 49152) == BackwardTensorTile(32, 32)
    assert choose_backward_tensor_tile(48, 49152) is None and choose_backward_tensor_tile(128, 49152) is None
    assert choose_backward_tensor_tile(64, 32768) is None


SMALL_TILES = (TensorTile(16, 16, 32),), (BackwardTensorTile(16, 16, 32),)  # fit lavapipe's 32 KiB in f32


@pytest.fixture
def emulated_high(high, monkeypatch):
    """"high" attention on the emulated kernels with tiles that fit here, as on a device with tensor cores whose
    attention is yet to be checked: the backend's matmuls say they have them (no matmul runs in these tests)."""
    gpu = high
    monkeypatch.setattr(attention_tensor, "TENSOR_TILES", SMALL_TILES[0])
    monkeypatch.setattr(attention_tensor_backward, "BACKWARD_TENSOR_TILES", SMALL_TILES[1])
    monkeypatch.setattr(gpu.mm, "_tensor_cores", (True, ""))
    monkeypatch.setattr(gpu.attention, "tensor", TensorAttention(gpu.rt, emulate=True))
    monkeypatch.setattr(gpu.attention, "tensor_backward", TensorBackward(gpu.rt, emulate=True))
    monkeypatch.setattr(gpu.attention, "checked", {})
    monkeypatch.setattr(gpu.attention, "choice", AttentionChoice(gpu.mm))
    return gpu


def run_attention(gpu, case):
    """y, lse and g_qkv of the backend's attention on a case, and the case's qkv."""
    batch, seq, n_head, head_size, _ = case
    qkv = make_qkv(*case)
    grad = np.random.default_rng(1).standard_normal((batch, seq, n_head * head_size)).astype(np.float32)
    d_qkv = gpu.from_numpy(qkv)
    y, lse = gpu.attention_forward(d_qkv, n_head, head_size ** -0.5)
    g_qkv = gpu.attention_backward(gpu.from_numpy(grad), d_qkv, y, lse, n_head, head_size ** -0.5)
    return [gpu.to_numpy(x) for x in (y, lse, g_qkv)], qkv


def test_check_passes(emulated_high, monkeypatch):
    """Right kernels pass the first-use check, which runs the head size's tiles forward and backward, and then
    "high" attention runs on them where they are chosen."""
    gpu = emulated_high
    assert gpu.attention.tensor_cores(64) and gpu.attention.checked == {64: ""}
    assert {tile for _, tile in gpu.attention.tensor.shaders} == set(SMALL_TILES[0])
    assert {tile for _, tile in gpu.attention.tensor_backward.shaders} == set(SMALL_TILES[1])
    choose(gpu, monkeypatch, BASIC[64])
    (y, lse, _), qkv = run_attention(gpu, BASIC[64])
    assert (64, SMALL_TILES[0][0]) in gpu.attention.tensor.shaders
    check_forward(y, lse, qkv, 2, "emulated, checked")
    assert gpu.describe()["attention"].endswith("forward B2 T17 nh2 hs64: tensor (untimed); "
                                                "backward B2 T17 nh2 hs64: tensor (untimed)")


def no_forward(*args):
    """A forward that writes nothing."""


def no_backward(*args):
    """A backward that writes nothing."""


def no_compile(*args):
    return "this is not WGSL"


@pytest.mark.parametrize("broken", ["forward", "backward", "compile"])
def test_check_refuses(emulated_high, monkeypatch, broken):
    """A tensor-core forward or backward that answers wrong, or does not compile, fails the first-use check:
    "high" attention then gives the float32 kernels' answers, after one notice, and `tinynn info` says why."""
    gpu = emulated_high
    if broken == "compile":
        monkeypatch.setattr(attention_tensor, "tensor_source", no_compile)
    else:
        kernel = gpu.attention.tensor if broken == "forward" else gpu.attention.tensor_backward
        monkeypatch.setattr(kernel, broken, no_forward if broken == "forward" else no_backward)
    case = (1, 20, 2, 64, (1, 1, 1))
    with pytest.warns(TinynnNotice, match="attention in matmul precision 'high' runs in float32") as notices:
        high, _ = run_attention(gpu, case)
    assert len(notices) == 1
    why = gpu.describe()["attention"]
    assert why.startswith("float32 in every precision: the tensor-core attention") and \
        {"forward": "forward", "backward": "backward", "compile": "failed its test case"}[broken] in why
    precision.set_matmul_precision("highest")
    highest, _ = run_attention(gpu, case)
    for a, b in zip(high, highest):
        np.testing.assert_array_equal(a, b)


def test_the_check_runs_each_head_size_that_runs(emulated_high, monkeypatch):
    """Each head size is checked on the tiles that run it, at its first use: a forward right at head size 64 and
    wrong at 20 (its head padded to 32 columns) is refused at 20, though a check of each tile at one head size
    passes it; from then on every head size runs float32, and the answers are float32's."""
    gpu = emulated_high
    right = gpu.attention.tensor.forward

    def wrong_at_20(qkv, y, lse, n_head, scale, tile=None):
        if qkv.shape[2] // 3 // n_head != 20:  # at 20 it writes nothing
            right(qkv, y, lse, n_head, scale, tile)
    monkeypatch.setattr(gpu.attention.tensor, "forward", wrong_at_20)
    for case in (BASIC[64], BASIC[20]):
        choose(gpu, monkeypatch, case)
    (y, lse, _), qkv = run_attention(gpu, BASIC[64])
    assert (64, SMALL_TILES[0][0]) in gpu.attention.tensor.shaders
    check_forward(y, lse, qkv, 2, "head size 64, checked")
    with pytest.warns(TinynnNotice, match="attention in matmul precision 'high' runs in float32: the tensor-core "
                                          r"attention forward \(tile 16x16x32, head size 20\)"):
        (y, lse, _), qkv = run_attention(gpu, BASIC[20])
    check_forward(y, lse, qkv, 1, "head size 20, refused")
    assert not gpu.attention.tensor_cores(64)
    assert gpu.describe()["attention"].startswith("float32 in every precision: the tensor-core attention forward")
