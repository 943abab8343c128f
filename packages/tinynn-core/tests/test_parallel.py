"""The thread pool (parallel.py) and the NumPy backend's ops cut into blocks on it: the same bits in one piece as
by blocks, on one thread as on several, where the math is elementwise or row-wise; sums across rows the same
for every thread count."""
import threading

import numpy as np
import pytest

from tinynn import blas, parallel
from tinynn.errors import TinynnError
from tinynn.numpy_backend import NUMPY

SMALL_BLOCK = 1 << 12  # many blocks for the shapes below
ONE_PIECE = 1 << 40  # every array one block


@pytest.fixture(autouse=True)
def restore_pool(monkeypatch):
    yield
    parallel.set_num_threads(None)


def setting(monkeypatch, threads, block):
    parallel.set_num_threads(threads)
    monkeypatch.setattr(parallel, "BLOCK_ELEMENTS", block)


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_blocks_cover_the_rows_once_in_order():
    for rows, row_size in ((0, 5), (1, 1), (7, 1 << 20), (1000, 3), (4097, 1), (123, 4096)):
        spans = parallel.blocks(rows, row_size)
        assert [lo for lo, _ in spans] == [0] + [hi for _, hi in spans[:-1]] if rows else spans == []
        assert (spans[-1][1] if spans else 0) == rows
        assert all(0 < hi - lo and (hi - lo) * row_size <= max(parallel.BLOCK_ELEMENTS, row_size) for lo, hi in spans)


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_run_calls_fn_once_per_item_on_up_to_threads_threads(threads):
    parallel.set_num_threads(threads)
    seen, names, lock = [], set(), threading.Lock()

    def fn(item):
        with lock:
            seen.append(item)
            names.add(threading.current_thread().name)
    parallel.run(fn, list(range(23)))
    assert sorted(seen) == list(range(23))
    assert 1 <= len(names) <= threads


def test_run_raises_a_workers_error_and_work_submitted_inside_a_worker_runs_there():
    parallel.set_num_threads(4)

    def fail(item):
        if item == 7:
            raise ValueError("item 7")
    with pytest.raises(ValueError, match="item 7"):
        parallel.run(fail, list(range(10)))
    totals = [0] * 8
    parallel.run(lambda i: parallel.run(lambda j: totals.__setitem__(i, totals[i] + j), list(range(5))),
                 list(range(8)))  # a pool waiting on itself would hang here
    assert totals == [10] * 8


def test_run_waits_for_the_items_taken_never_for_a_busy_thread():
    """With every pool thread held by another caller's run, a run is done by its caller alone and returns."""
    parallel.set_num_threads(2)
    release, holding = threading.Event(), threading.Semaphore(0)

    def hold(item):
        holding.release()
        release.wait(10)
    other = threading.Thread(target=parallel.run, args=(hold, [0, 1]))  # its caller and the pool's thread
    other.start()
    try:
        for _ in range(2):
            assert holding.acquire(timeout=10)  # both held
        done = []
        mine = threading.Thread(target=lambda: done.append(parallel.run(lambda i: None, list(range(10)))))
        mine.start()
        mine.join(5)
        assert done == [None], "run waited for a pool thread that took none of its items"
    finally:
        release.set()
        other.join()


def test_num_threads_comes_from_the_environment_or_the_cores(monkeypatch):
    monkeypatch.setenv(parallel.ENV, "3")
    parallel.set_num_threads(None)
    assert parallel.num_threads() == 3 and parallel.describe()["from"] == parallel.ENV
    monkeypatch.delenv(parallel.ENV)
    parallel.set_num_threads(None)
    assert parallel.num_threads() == parallel.cores() >= 1
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv(parallel.ENV, bad)
        parallel.set_num_threads(None)
        with pytest.raises(TinynnError, match=parallel.ENV):
            parallel.num_threads()
    with pytest.raises(TinynnError, match="0"):
        parallel.set_num_threads(0)


def test_the_cpu_backend_describes_its_pool(monkeypatch):
    """What `tinynn info` prints under the active backend."""
    monkeypatch.setenv(parallel.ENV, "5")
    parallel.set_num_threads(None)
    assert NUMPY.describe()["threads"].startswith(f"5 (from {parallel.ENV}")


def outputs(rng_seed):
    """Every op the backend cuts into blocks, on fresh inputs drawn from the seed: {name: arrays}."""
    rng = np.random.default_rng(rng_seed)
    rows, width = 300, int(rng.integers(60, 90))
    x, g, y = randn(rng, rows, width), randn(rng, rows, width), np.abs(randn(rng, rows, width)) + 0.1
    bias, weight = randn(rng, width), randn(rng, width)
    out = {}
    for op in ("neg", "exp", "log", "tanh", "relu", "gelu"):
        out[f"unary {op}"] = NUMPY.unary(op, y if op == "log" else x)
        out[f"unary_backward {op}"] = NUMPY.unary_backward(op, y if op == "log" else x, y, g)
    for op in ("add", "sub", "mul", "div", "eq"):
        out[f"binary {op}"] = NUMPY.binary(op, x, y)
        out[f"binary {op} by rows"] = NUMPY.binary(op, x, bias)
    for op, s in (("add", 0.5), ("mul", -3.0), ("pow", 2), ("pow", 0.5)):
        out[f"scalar {op} {s}"] = NUMPY.scalar(op, y, s)
    out["softmax"] = NUMPY.softmax_forward(x, scale=0.7)
    out["softmax_backward"] = NUMPY.softmax_backward(out["softmax"], g, scale=0.7)
    out["log_softmax"] = NUMPY.log_softmax_forward(x)
    out["layernorm"] = NUMPY.layernorm_forward(x.reshape(3, rows // 3, width), weight, bias, 1e-5)
    mean, rstd = out["layernorm"][1:]
    out["layernorm_backward g_x"] = NUMPY.layernorm_backward(g.reshape(3, -1, width), x.reshape(3, -1, width),
                                                             weight, mean, rstd, g_add=y.reshape(3, -1, width))[0]
    w = randn(rng, 2 * width, width)
    out["linear gelu"] = NUMPY.linear_forward(x, w, randn(rng, 2 * width), activation="gelu")
    out["linear residual"] = NUMPY.linear_forward(x, w[:width], bias, residual=y)[0]
    B, T, n_head = 2, 200, 2  # n_head * T * T > SCORES_BLOCK: more than one block of queries
    qkv = randn(rng, B, T, 3 * 2 * 16)
    att, lse = NUMPY.attention_forward(qkv, n_head, 0.25)
    out["attention"] = att, lse
    out["attention_backward"] = NUMPY.attention_backward(randn(rng, *att.shape), qkv, att, lse, n_head, 0.25)
    params, grads = [randn(rng, rows, width), randn(rng, 7)], [randn(rng, rows, width), randn(rng, 7)]
    m, v = [p * 0.1 for p in params], [np.abs(p) for p in params]
    NUMPY.adamw_update_(params, grads, m, v, np.array([1e-2, 0.1, 0.01], np.float32), beta1=0.9, beta2=0.99,
                        eps=1e-8, weight_decay=[0.1, 0.0], grad_scale=np.float32(0.5))
    out["adamw"] = params + m + v
    buffers = [p.copy() for p in params]
    NUMPY.sgd_update_(params, grads, buffers, np.array([0.1], np.float32), momentum=0.9, weight_decay=0.01)
    out["sgd"] = params + buffers
    return out


def cross_row_sums(rng_seed):
    """The ops that add across rows, through per-block partial sums."""
    rng = np.random.default_rng(rng_seed)
    rows, width = 500, 70
    x, g = randn(rng, rows, width), randn(rng, rows, width)
    weight, bias = randn(rng, width), randn(rng, width)
    _, mean, rstd = NUMPY.layernorm_forward(x, weight, bias, 1e-5)
    return {"layernorm_backward": NUMPY.layernorm_backward(g, x, weight, mean, rstd),
            "linear_backward": NUMPY.linear_backward(g, x, randn(rng, width, width)),
            "global_norm": NUMPY.global_norm([x, g, weight])}


def assert_same_bits(a, b, what):
    for name in a:
        left, right = a[name], b[name]
        for i, (l, r) in enumerate(zip(*((v if isinstance(v, (list, tuple)) else [v]) for v in (left, right)))):
            if l is None:
                assert r is None, f"{what}: {name}[{i}]"
                continue
            assert l.dtype == r.dtype and l.shape == r.shape, f"{what}: {name}[{i}]"
            assert np.array_equal(l, r, equal_nan=True), \
                f"{what}: {name}[{i}] differs by up to {np.nanmax(np.abs(l.astype(float) - r)):.3g}"


def attention_by_formula(qkv, n_head, scale, g):
    """Attention and its gradient from the whole T x T matrices, in float64."""
    B, T, C3 = qkv.shape
    q, k, v = qkv.astype(np.float64).reshape(B, T, 3, n_head, -1).transpose(2, 0, 3, 1, 4)  # (B, nh, T, hs) each
    future = np.triu(np.ones((T, T), bool), 1)
    p = np.exp(np.where(future, -np.inf, scale * q @ k.swapaxes(-1, -2)))
    p /= p.sum(-1, keepdims=True)
    y = p @ v
    g_y = g.astype(np.float64).reshape(B, T, n_head, -1).transpose(0, 2, 1, 3)
    g_s = p * (g_y @ v.swapaxes(-1, -2) - (g_y * y).sum(-1, keepdims=True))
    grads = np.stack([scale * g_s @ k, scale * g_s.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ g_y])
    return y.transpose(0, 2, 1, 3).reshape(B, T, -1), grads.transpose(1, 3, 0, 2, 4).reshape(qkv.shape)


@pytest.mark.parametrize("scores", [1 << 6, 1 << 11, 1 << 40])
def test_attention_by_blocks_of_queries_is_the_formula(monkeypatch, scores):
    """Blocks of a few queries each (over the keys up to their last one), down to one query a block."""
    monkeypatch.setattr("tinynn.numpy_formulas.SCORES_BLOCK", scores)
    parallel.set_num_threads(3)
    rng = np.random.default_rng()
    B, T, n_head, hs = int(rng.integers(1, 4)), int(rng.integers(20, 70)), 2, 8
    qkv, g = randn(rng, B, T, 3 * n_head * hs), randn(rng, B, T, n_head * hs)
    y, lse = NUMPY.attention_forward(qkv, n_head, 0.3)
    want_y, want_g_qkv = attention_by_formula(qkv, n_head, 0.3, g)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(NUMPY.attention_backward(g, qkv, y, lse, n_head, 0.3), want_g_qkv, rtol=1e-4, atol=1e-5)


def test_blocks_and_threads_give_the_bits_of_one_piece(monkeypatch):
    seed = np.random.default_rng().integers(2**31)
    setting(monkeypatch, 1, ONE_PIECE)
    whole = outputs(seed)
    for threads in (1, 3, 8):
        setting(monkeypatch, threads, SMALL_BLOCK)
        assert_same_bits(whole, outputs(seed), f"{threads} threads, blocks of {SMALL_BLOCK} (seed {seed})")


def test_sums_across_rows_are_the_same_for_every_thread_count(monkeypatch):
    seed = np.random.default_rng().integers(2**31)
    setting(monkeypatch, 1, SMALL_BLOCK)
    one = cross_row_sums(seed)
    for threads in (2, 3, 8):
        setting(monkeypatch, threads, SMALL_BLOCK)
        assert_same_bits(one, cross_row_sums(seed), f"{threads} threads (seed {seed})")
    setting(monkeypatch, 1, ONE_PIECE)
    whole = cross_row_sums(seed)
    for name in one:  # another cut adds in another order: close, not equal
        for a, b in zip(*((v if isinstance(v, tuple) else (v,)) for v in (one[name], whole[name]))):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("threads", [1, 2, 3, 16])
def test_tiles_cover_a_product_once(threads):
    parallel.set_num_threads(threads)
    for m, n, k in ((2048, 768, 256), (256, 256, 2048), (1000, 65, 300), (37, 1000, 4096), (5, 3, 2), (0, 4, 4),
                    (16, 256, 1 << 14), (16, 100, 1 << 16), (1, 50304, 768)):
        covered = np.zeros((m, n), int)
        tiles = parallel.tiles(m, n, k)
        for rows, cols in tiles:
            covered[rows, cols] += 1
        assert (covered == 1).all(), (m, n, k, threads)
        assert len(tiles) <= max(1, threads * parallel.TILES_PER_THREAD + n // parallel.TILE_COLS + 1)
        assert threads > 1 or len(tiles) == 1  # one thread: the product whole


def test_a_product_of_few_rows_is_cut_into_columns(monkeypatch):
    """A decode step's product (16 rows, one block of BLAS's row kernels) asked for 4 tiles gets 4 column strips,
    also where it is only 256 columns wide."""
    parallel.set_num_threads(2)
    monkeypatch.setattr(parallel, "MIN_TILE_WORK", 1 << 20)
    for m, n, k in ((16, 256, 1024), (16, 1024, 256), (8, 256, 2048)):
        tiles = parallel.tiles(m, n, k)
        assert len(tiles) == 4 and all(rows == slice(0, m) for rows, _ in tiles), (m, n, k)
        assert [cols.stop - cols.start for _, cols in tiles] == [n // 4] * 4


@pytest.mark.parametrize("threads", [1, 3])
def test_a_linear_layer_by_tiles_is_its_formula_and_the_same_bits_every_run(threads):
    """Products large enough to be cut into tiles; the bias, GELU and residual finish each tile in place."""
    parallel.set_num_threads(threads)
    rng = np.random.default_rng()
    n, c_in, c_out = int(rng.integers(300, 700)), 96, int(rng.integers(300, 600))
    x, w, b = randn(rng, n, c_in), randn(rng, c_out, c_in) / 10, randn(rng, c_out)
    res = randn(rng, n, c_out)
    assert (len(parallel.tiles(n, c_out, c_in)) > 1) == (threads > 1)
    y, pre = NUMPY.linear_forward(x, w, b, activation="gelu")
    np.testing.assert_allclose(pre, x.astype(np.float64) @ w.T + b, rtol=1e-4, atol=1e-4)
    assert np.array_equal(y, NUMPY.unary("gelu", pre))  # the epilogue is GELU's formula on every element
    y2, pre2 = NUMPY.linear_forward(x, w, b, activation="gelu")
    assert np.array_equal(y, y2) and np.array_equal(pre, pre2)
    plain = NUMPY.linear_forward(x, w)[0]
    assert np.array_equal(NUMPY.linear_forward(x, w, b, residual=res)[0], plain + b + res)
    g = randn(rng, n, c_out)
    g_x, g_w, g_b = NUMPY.linear_backward(g, x, w, pre, "gelu")
    g_pre = NUMPY.unary_backward("gelu", pre, None, g)
    np.testing.assert_allclose(g_x, g_pre.astype(np.float64) @ w, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(g_w, g_pre.T.astype(np.float64) @ x, rtol=1e-4, atol=1e-2)
    g_h = NUMPY.linear_backward(g, x, w, x_activation="gelu", x_pre=x, has_bias=False)[0]
    assert np.array_equal(g_h, NUMPY.unary_backward("gelu", x, None, NUMPY.linear_backward(g, x, w)[0]))


def test_products_on_the_pool_run_blas_on_one_thread(monkeypatch):
    if not blas.available():
        pytest.skip("NumPy's BLAS is not an OpenBLAS whose thread count tinynn can set")
    parallel.set_num_threads(2)
    get, put = blas._get_calls()
    before, seen = get(), []
    put(2)  # as BLAS starts where nothing limits it (the tests' conftest does)
    real = np.matmul
    monkeypatch.setattr(np, "matmul", lambda *a, **k: seen.append(blas.threads()) or real(*a, **k))
    try:
        a, b = np.ones((512, 256), np.float32), np.ones((256, 512), np.float32)
        assert np.array_equal(parallel.matmul(a, b), np.full((512, 512), 256, np.float32))
        assert seen and set(seen) == {1} and blas.threads() == 2
    finally:
        put(before)


def test_a_decode_steps_product_runs_on_blas_threads_as_many_as_the_pools(monkeypatch):
    """A product of a few rows too small to cut (a decode step's) runs whole on BLAS's threads, the pool's
    count of them but no more than the cores, and its epilogue sees every row; a 1-thread pool keeps BLAS on one."""
    if not blas.available():
        pytest.skip("NumPy's BLAS is not an OpenBLAS whose thread count tinynn can set")
    get, put = blas._get_calls()
    before, seen = get(), []
    real = np.matmul
    monkeypatch.setattr(np, "matmul", lambda *a, **k: seen.append(blas.threads()) or real(*a, **k))
    rng = np.random.default_rng(0)
    x, w, b = randn(rng, 16, 256), randn(rng, 1024, 256), randn(rng, 1024)
    try:
        for threads in (3, 1):
            parallel.set_num_threads(threads)
            put(2)
            seen.clear()
            assert len(parallel.tiles(16, 1024, 256)) == 1
            y = NUMPY.linear_forward(x, w, b, activation="gelu", for_backward=False)[0]
            assert seen == [min(threads, parallel.cores())] and blas.threads() == 2
            np.testing.assert_allclose(y, NUMPY.unary("gelu", (x.astype(np.float64) @ w.T + b).astype(np.float32)),
                                       rtol=1e-4, atol=1e-4)
    finally:
        put(before)
        parallel.set_num_threads(None)
