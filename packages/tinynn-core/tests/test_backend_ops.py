"""Every backend operation against the NumPy reference, once per available backend, on fresh random
float32 inputs (relative Frobenius error <= 1e-5). On the CPU this checks the harness; with tinynn-gpu
installed it checks every GPU kernel through the same interface core uses."""
import warnings

import numpy as np
import pytest

import tinynn
from tinynn import backends
from tinynn import functional as F
from tinynn.errors import TinynnError
from helpers import relative_error

REF = backends.reference()
RTOL = 1e-5


def run_both(backend, name, *args, **kwargs):
    """Run op `name` on `backend` and on the reference; return both results as NumPy (tuples kept)."""
    def to(be, x):
        if isinstance(x, np.ndarray):
            return be.from_numpy(x)
        if isinstance(x, list):
            return [to(be, v) for v in x]
        return x

    def back(be, x):
        if isinstance(x, tuple):
            return tuple(back(be, v) for v in x)
        return None if x is None else be.to_numpy(x)
    def call(be):
        return getattr(be, name)(*[to(be, a) for a in args], **{k: to(be, v) for k, v in kwargs.items()})
    ours, ref = back(backend, call(backend)), back(REF, call(REF))
    return ours, ref


def check(backend, name, *args, rtol=RTOL, **kwargs):
    ours, ref = run_both(backend, name, *args, **kwargs)
    for o, r in zip(ours, ref) if isinstance(ref, tuple) else [(ours, ref)]:
        if r is None:
            assert o is None
            continue
        assert o.shape == r.shape, f"{name}: shape {o.shape} != {r.shape}"
        assert o.dtype == r.dtype, f"{name}: dtype {o.dtype} != {r.dtype}"
        err = relative_error(o, r)
        assert err <= rtol, f"{name}: relative error {err:.3g} > {rtol}"
    return ours


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_transfer_roundtrip(backend, rng):
    for x in (randn(rng, 3, 5), rng.integers(-5, 5, (4,)), np.float32(2.5) * np.ones(())):
        y = backend.to_numpy(backend.from_numpy(x))
        assert y.shape == x.shape
        np.testing.assert_array_equal(y, x)
    for value, dtype in ((0.0, np.float32), (1.0, np.float32), (-2.5, np.float32), (3, np.int64)):
        full = backend.to_numpy(backend.full((2, 3), value, dtype))
        np.testing.assert_array_equal(full, np.full((2, 3), value))


@pytest.mark.parametrize("op", ["neg", "exp", "log", "tanh", "relu", "gelu"])
def test_unary_and_backward(backend, op, rng):
    x = randn(rng, 7, 33)
    if op == "log":
        x = np.abs(x) + 0.1
    y = check(backend, "unary", op, x)
    check(backend, "unary_backward", op, x, y, randn(rng, 7, 33))


# GELU's inputs from tiny to huge, both signs: past |x| ~ 10 exp(2u) leaves float32's range, past 5e19 x^2 u' would
GELU_EDGES = np.array([1e-30, 1e-3, 0.5, 1, 3, 5, 9, 10, 11, 12, 13, 20, 100, 1e4, 1e13, 1e18, 1e30, 3e38], np.float32)


def gelu64(x):
    """GELU (tanh form) and its derivative in float64, through the sigmoid: 1 + tanh(u) cancels to 0 for u < -19
    even in float64, where GELU(x) = x / (1 + exp(-2u)) is still ~1e-16 x."""
    x = x.astype(np.float64)
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-2 * 0.7978845608028654 * (x + 0.044715 * x**3)))
        return x * s, s + 2 * x * s * (1 - s) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x)


def test_gelu_at_extreme_inputs(backend):
    """GELU and its gradient against float64 from 1e-30 to 3e38, both signs: finite for every finite input, with no
    warning, and a relative error of float32's size also where GELU(x) is tiny (x < 0). The tanh form fails it:
    1 + tanh(u) rounds to 0 in float32 for x < -5.4. rtol: u rounds to float32 (up to 1.1e-5 relative in exp(2u)
    near x = -9), and WGSL's exp may err by 3 + 2|2u| ulp (1e-5 there); atol: results near float32's smallest
    normal, flushed to 0 or not."""
    x = np.concatenate([-GELU_EDGES[::-1], [0], GELU_EDGES]).astype(np.float32)
    want, want_grad = gelu64(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dx = backend.from_numpy(x)
        y = backend.unary("gelu", dx)
        grad = backend.unary_backward("gelu", dx, y, backend.from_numpy(np.ones_like(x)))
        y, grad = backend.to_numpy(y), backend.to_numpy(grad)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=5e-5, atol=1e-35)
    np.testing.assert_allclose(grad.astype(np.float64), want_grad, rtol=5e-5, atol=1e-35)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "eq"])
def test_binary_broadcast(backend, op, rng):
    a = randn(rng, 3, 4, 5)
    for b in (randn(rng, 3, 4, 5), randn(rng, 5), randn(rng, 4, 1), randn(rng, 1, 1, 1)):
        if op == "div":
            b = np.sign(b) * (np.abs(b) + 0.5)
        if op == "eq":
            b = np.where(rng.random(b.shape) < 0.5, b, 0).astype(np.float32)
            a = np.broadcast_to(b, a.shape).copy()
            a[0] += 1
        check(backend, "binary", op, a, b)
        check(backend, "binary", op, b, a)


@pytest.mark.parametrize("op,s", [("add", 1.5), ("mul", -0.25), ("pow", 2.0), ("pow", -1.0), ("pow", 0.5)])
def test_scalar(backend, op, s, rng):
    x = np.abs(randn(rng, 5, 9)) + 0.1
    check(backend, "scalar", op, x, s)


def test_layout(backend, rng):
    x = randn(rng, 2, 3, 4, 5)
    check(backend, "reshape", x, (6, 20))
    check(backend, "permute", x, (2, 0, 3, 1))
    check(backend, "broadcast_to", randn(rng, 3, 1, 5), (2, 3, 4, 5))
    for index in ((slice(None), slice(1, 3)), (1,), (Ellipsis, slice(0, 5, 2)), (0, slice(None), 2)):
        check(backend, "getitem", x, index)
        out = REF.getitem(x, index)
        check(backend, "getitem_backward", randn(rng, *out.shape), index, x.shape)
    check(backend, "concatenate", [randn(rng, 2, 3), randn(rng, 2, 1), randn(rng, 2, 4)], 1)
    check(backend, "concatenate", [randn(rng, 1, 3), randn(rng, 2, 3)], 0)
    check(backend, "causal_fill", randn(rng, 2, 5, 5), -1e9)


@pytest.mark.parametrize("axes,keepdims", [((0,), False), ((2,), True), ((1, 2), False), ((0, 2), True),
                                           ((0, 1, 2), False)])
def test_reductions(backend, axes, keepdims, rng):
    x = randn(rng, 5, 6, 7)
    check(backend, "sum", x, axes, keepdims)
    check(backend, "max", x, axes, keepdims)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul(backend, ta, tb, rng):
    for batch, m, k, n in [((), 17, 33, 9), ((3,), 5, 70, 21), ((2, 2), 1, 1, 1), ((), 64, 64, 64)]:
        a = randn(rng, *batch, *((k, m) if ta else (m, k)))
        b = randn(rng, *batch, *((n, k) if tb else (k, n)))
        check(backend, "matmul", a, b, ta, tb)
    check(backend, "matmul", randn(rng, 4, 6, 8), randn(rng, 8, 3))  # one weight for every batch
    for _ in range(2):  # twice: the GPU plans a shape the first time and reuses the plan after
        check(backend, "matmul", randn(rng, 2, 1, 3, 4), randn(rng, 5, 4, 2))  # batch axes that broadcast
        check(backend, "matmul", randn(rng, 0, 5), randn(rng, 5, 3))  # an empty output


def test_softmax_family(backend, rng):
    x = randn(rng, 2, 3, 6, 6)
    for causal, scale in ((False, 1.0), (True, 1.0), (True, 0.125)):
        y = check(backend, "softmax_forward", x, causal, scale)
        check(backend, "softmax_backward", y, randn(rng, *x.shape), scale)
    y = check(backend, "log_softmax_forward", x)
    check(backend, "log_softmax_backward", y, randn(rng, *x.shape))


def test_layernorm(backend, rng):
    x, w, b = randn(rng, 4, 5, 48), randn(rng, 48), randn(rng, 48)
    for weight, bias in ((w, b), (w, None), (None, None)):
        _, mean, rstd = check(backend, "layernorm_forward", x, weight, bias, 1e-5)
        check(backend, "layernorm_backward", randn(rng, *x.shape), x, weight, mean, rstd, has_bias=bias is not None)
        check(backend, "layernorm_backward", randn(rng, *x.shape), x, weight, mean, rstd, has_bias=bias is not None,
              g_add=randn(rng, *x.shape))


def test_forwards_without_backward_make_only_their_results(backend, rng):
    """for_backward=False (a forward under no_grad): the outputs only a backward reads come back as None and
    the results are the same bits as with them."""
    x, w, b = randn(rng, 6, 5, 16), randn(rng, 16), randn(rng, 16)
    x2, weight, residual = randn(rng, 30, 16), randn(rng, 24, 16), randn(rng, 30, 24)
    logits, targets = randn(rng, 30, 7), rng.integers(0, 7, 30)
    qkv = randn(rng, 2, 5, 3 * 16)
    calls = [("layernorm_forward", (x, w, b, 1e-5)), ("linear_forward", (x2, weight, None, residual, "gelu")),
             ("cross_entropy_forward", (logits, targets, -100)), ("attention_forward", (qkv, 2, 0.25))]
    for name, args in calls:
        full = run_both(backend, name, *args)[0]
        ours, ref = run_both(backend, name, *args, for_backward=False)
        assert ours[1:] == ref[1:] == (None,) * (len(full) - 1), name
        np.testing.assert_array_equal(ours[0], full[0], err_msg=name)
        assert relative_error(ours[0], ref[0]) <= RTOL, name


def test_cross_entropy(backend, rng):
    logits, targets = randn(rng, 37, 11), rng.integers(0, 11, 37)
    targets[3] = -100
    _, probs, count = check(backend, "cross_entropy_forward", logits, targets, -100)
    assert count == 36
    for given in (None, count):
        check(backend, "cross_entropy_backward", probs, targets, np.asarray(0.7, np.float32), -100, count=given)


def test_embedding(backend, rng):
    w, idx = randn(rng, 13, 24), rng.integers(0, 13, (3, 9))
    check(backend, "embedding_forward", w, idx)
    check(backend, "embedding_backward", randn(rng, 3, 9, 24), idx, 13)
    check(backend, "embedding_with_positions_forward", w, randn(rng, 12, 24), idx)  # 12 positions, T = 9
    check(backend, "embedding_with_positions_backward", randn(rng, 3, 9, 24), idx, 13, 12)


def test_embedding_with_positions_is_the_sum_of_two_embeddings(backend, rng):
    """The fused op's value and gradients are those of wte(idx) + wpe(0..T-1) op by op; too many positions are
    refused."""
    idx, tables, results = rng.integers(0, 13, (3, 9)), (randn(rng, 13, 8), randn(rng, 12, 8)), []
    for fused in (True, False):
        wte, wpe = (tinynn.tensor(t, requires_grad=True, backend=backend) for t in tables)
        y = F.embedding_with_positions(wte, wpe, idx) if fused else \
            F.embedding(wte, idx) + F.embedding(wpe, np.arange(9))
        (y * y).sum().backward()
        results.append((y.numpy(), wte.grad.numpy(), wpe.grad.numpy()))
    for fused, plain in zip(*results):
        assert relative_error(fused, plain) <= RTOL
    with pytest.raises(ValueError, match="positions"):
        F.embedding_with_positions(wte, wpe, np.zeros((2, 13), np.int64))


def test_dropout_mask(backend):
    mask = backend.to_numpy(backend.dropout_mask((100, 100), 0.25, 7, np.float32))
    assert set(np.unique(mask)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.7 < (mask != 0).mean() < 0.8


def test_norm_and_clip(backend, rng):
    arrays = [randn(rng, 3, 4), randn(rng, 10)]
    norm = check(backend, "global_norm", arrays)
    assert norm.shape == ()
    for max_norm in (0.5, 1e3):
        check(backend, "global_norm_and_clip", arrays, max_norm)


@pytest.mark.parametrize("clip", [None, 0.5])
def test_optimizer_updates_in_place(backend, clip, rng):
    shapes = [(3, 4), (10,), (1,)]
    for name, hyper, kwargs, n_bufs in [
        ("adamw_update_", [0.01, 1 - 0.9**3, 1 - 0.99**3], dict(beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1), 2),
        ("sgd_update_", [0.1], dict(momentum=0.9, weight_decay=0.01), 1),
    ]:
        hyper = np.asarray(hyper, np.float32)
        host = [[randn(rng, *s) for s in shapes] for _ in range(2 + n_bufs)]
        host[3 if n_bufs == 2 else 2] = [np.abs(x) for x in host[-1]]  # second moments are non-negative
        ref = [[x.copy() for x in group] for group in host]
        ours = [[backend.from_numpy(x) for x in group] for group in host]
        scale = None if clip is None else np.asarray(clip, np.float32)
        getattr(REF, name)(*ref, hyper, grad_scale=scale, **kwargs)
        getattr(backend, name)(*ours, backend.from_numpy(hyper),
                               grad_scale=None if scale is None else backend.from_numpy(scale), **kwargs)
        for group_ours, group_ref in zip(ours, ref):
            for o, r in zip(group_ours, group_ref):
                assert relative_error(backend.to_numpy(o), r) <= RTOL, name


# --- every dtype an op accepts gets NumPy's answer (a GPU stores int32 and float32: the kind must match) ---

def check_values(backend, name, *args, **kwargs):
    """Op `name` on `backend` gives the reference's values and dtype kind (float64 -> float32 on a GPU)."""
    ours, ref = run_both(backend, name, *args, **kwargs)
    assert ours.dtype.kind == ref.dtype.kind, f"{name}: dtype {ours.dtype} where NumPy gives {ref.dtype}"
    assert ours.shape == ref.shape, f"{name}: shape {ours.shape} != {ref.shape}"
    if ref.dtype.kind == "f":
        assert relative_error(ours, ref) <= RTOL, f"{name}: relative error {relative_error(ours, ref):.3g}"
    else:
        np.testing.assert_array_equal(ours, ref, err_msg=name)


def ints(rng, *shape, low=-50, high=50):
    return rng.integers(low, high, shape).astype(np.int32)


def test_integer_tensors_compute_the_cpus_answers(backend):
    t = tinynn.tensor([5, 6, 7], backend=backend)
    for got, want in ((t + 1, [6, 7, 8]), (t.sum(), 18), (t * t, [25, 36, 49]), (t - 2, [3, 4, 5]),
                      (-t, [-5, -6, -7]), (t * 3, [15, 18, 21])):
        assert got.dtype.kind == "i", got.dtype
        np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_allclose((t / 2).numpy(), [2.5, 3.0, 3.5])  # true division: a float result
    np.testing.assert_allclose((t + 0.5).numpy(), [5.5, 6.5, 7.5])


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "eq"])
def test_binary_on_int32(backend, op, rng):
    a = ints(rng, 3, 4, 5)
    for b in (ints(rng, 3, 4, 5, low=1), ints(rng, 5, low=1), ints(rng, 4, 1, low=1)):  # no 0 to divide by
        if op == "eq":
            a = np.broadcast_to(b, a.shape).copy()
            a[0] += 1
        check_values(backend, "binary", op, a, b)
    check_values(backend, "binary", op, a, randn(rng, 5))  # mixed int and float: NumPy promotes to float


@pytest.mark.parametrize("op,s", [("add", 3), ("mul", -2), ("add", 1.5), ("mul", 0.25), ("pow", 2), ("pow", 0.5)])
def test_scalar_on_int32(backend, op, s, rng):
    check_values(backend, "scalar", op, ints(rng, 4, 9, low=0), s)


@pytest.mark.parametrize("op", ["neg", "relu", "exp", "tanh"])
def test_unary_on_int32(backend, op, rng):
    check_values(backend, "unary", op, ints(rng, 6, 7, low=-5, high=5))


def test_embedding_with_positions_of_int32_tables_computes_the_cpus_answers(backend, rng):
    """The fused kernels take float32 tables and gradients: int32 ones run on the reference, exactly."""
    idx = rng.integers(0, 13, (3, 9)).astype(np.int32)
    check_values(backend, "embedding_with_positions_forward", ints(rng, 13, 8), ints(rng, 12, 8), idx)
    ours, ref = run_both(backend, "embedding_with_positions_backward", ints(rng, 3, 9, 8), idx, 13, 12)
    for o, r in zip(ours, ref):  # the token and the position gradients
        assert o.dtype.kind == r.dtype.kind == "i", (o.dtype, r.dtype)
        np.testing.assert_array_equal(o, r)


def test_reductions_and_layout_on_int32(backend, rng):
    x = ints(rng, 2, 3, 4, 5)
    for axes in ((0,), (1, 3), (0, 1, 2, 3)):
        check_values(backend, "sum", x, axes)
        check_values(backend, "max", x, axes, True)
    x[0, 0, 0] = -1  # all ones: a NaN pattern if the copies read it as a float
    check_values(backend, "permute", x, (3, 1, 0, 2))
    check_values(backend, "broadcast_to", ints(rng, 3, 1, 5), (2, 3, 4, 5))
    check_values(backend, "getitem", x, (Ellipsis, slice(0, 5, 2)))
    check_values(backend, "concatenate", [ints(rng, 2, 3), ints(rng, 2, 4)], 1)
    check_values(backend, "concatenate", [ints(rng, 2, 3), randn(rng, 2, 4)], 1)


@pytest.mark.parametrize("family,op", [("unary", "sqrt"), ("binary", "pow"), ("scalar", "div")])
def test_unknown_op_codes_are_refused(backend, family, op, rng):
    x = randn(rng, 4)
    args = {"unary": (x,), "binary": (x, x), "scalar": (x, 2.0)}[family]
    with pytest.raises(ValueError, match=f"unknown {family} op '{op}'"):
        getattr(backend, family)(op, *[backend.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args])


# --- ids out of range: one error on every backend (a GPU raises it at its next read-back) ---

@pytest.mark.parametrize("bad", [13, -1, 2**20])
def test_embedding_ids_out_of_range_are_an_error(backend, bad, rng):
    w, idx = backend.from_numpy(randn(rng, 13, 8)), np.array([[0, 12], [3, bad]])
    with pytest.raises(TinynnError, match=r"embedding: an id is outside \[0, num_embeddings\)"):
        backend.to_numpy(backend.embedding_forward(w, backend.from_numpy(idx)))
    with pytest.raises(TinynnError, match="embedding: an id is outside"):
        backend.to_numpy(backend.embedding_backward(backend.from_numpy(randn(rng, 2, 2, 8)),
                                                    backend.from_numpy(idx), 13))
    with pytest.raises(TinynnError, match="embedding: an id is outside"):
        backend.to_numpy(backend.embedding_with_positions_forward(w, backend.from_numpy(randn(rng, 2, 8)),
                                                                  backend.from_numpy(idx)))
    with pytest.raises(TinynnError, match="embedding: an id is outside"):
        backend.to_numpy(backend.embedding_with_positions_backward(backend.from_numpy(randn(rng, 2, 2, 8)),
                                                                   backend.from_numpy(idx), 13, 2)[0])
    check(backend, "embedding_forward", randn(rng, 13, 8), np.array([0, 12]))  # the error does not linger


@pytest.mark.parametrize("bad", [11, -1, -101])
def test_cross_entropy_targets_out_of_range_are_an_error(backend, bad, rng):
    logits, targets = randn(rng, 5, 11), np.array([0, 10, -100, 3, bad])
    with pytest.raises(TinynnError, match="cross_entropy: a target is outside"):
        backend.to_numpy(backend.cross_entropy_forward(backend.from_numpy(logits), backend.from_numpy(targets),
                                                       -100)[0])
    with pytest.raises(TinynnError, match="cross_entropy: a target is outside"):
        probs = backend.from_numpy(np.full((5, 11), 1 / 11, np.float32))
        backend.to_numpy(backend.cross_entropy_backward(probs, backend.from_numpy(targets),
                                                        backend.from_numpy(np.float32(1.0) * np.ones(())), -100,
                                                        backend.from_numpy(np.float32(4.0) * np.ones(()))))
    targets[-1] = -100
    check(backend, "cross_entropy_forward", logits, targets, -100)  # ignore_index itself is fine
