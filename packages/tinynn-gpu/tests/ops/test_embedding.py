"""Embeddings and their gradients (ops/embedding.py) against NumPy, outputs poisoned with NaN, on drawn edge shapes."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinynn import backends
from tinynn.errors import TinynnError
from tinynn_gpu.ops import embedding

from gpu_checks import dispatches, rel_err

RTOL = 1e-5
dims = st.one_of(st.sampled_from([1, 2, 31, 32, 33, 255, 256, 257]), st.integers(1, 300))
REF = backends.reference()
FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(params=["scan", "sort"])
def path(request, monkeypatch):
    """The backward's way of listing each row's positions, forced whatever the shapes; its dispatch count."""
    monkeypatch.setattr(embedding, "SCAN_MAX_READS", 2**62 if request.param == "scan" else 0)
    return {"scan": 1, "sort": 2}[request.param]


def test_embedding_backward_over_many_chunks(poisoned, rng, path):
    """Enough positions that a row lists them in several chunks: 7000 ids scanned, or a sorted run of over 2048."""
    gpu = poisoned
    idx, g = rng.integers(0, 3, 7000), rng.standard_normal((7000, 16)).astype(np.float32)
    got, count = dispatches(gpu, lambda: gpu.embedding_backward(gpu.from_numpy(g), gpu.from_numpy(idx), 3))
    assert rel_err(gpu.to_numpy(got), REF.embedding_backward(g.astype(np.float64), idx, 3)) <= RTOL
    assert count == path


@pytest.mark.parametrize("batch, t, vocab, cols, count", [(16, 128, 65, 256, 1), (4, 64, 50304, 64, 2)],
                         ids=["lesson", "gpt2-vocabulary"])
def test_the_backward_scans_a_small_vocabulary_and_sorts_a_large_one(poisoned, rng, batch, t, vocab, cols, count):
    """At the lesson's shapes the ids are scanned, one dispatch in all (no sort); at GPT-2's vocabulary, where a
    scan would read V x N ids, they are sorted first, most rows finding no position. Both against NumPy, the last
    row's id drawn."""
    idx, dy = rng.integers(0, vocab, (batch, t)), rng.standard_normal((batch, t, cols)).astype(np.float32)
    idx[0, 0] = vocab - 1
    (g_wte, g_wpe), made = dispatches(poisoned, lambda: poisoned.embedding_with_positions_backward(
        poisoned.from_numpy(dy), poisoned.from_numpy(idx), vocab, t))
    want_wte, want_wpe = REF.embedding_with_positions_backward(dy.astype(np.float64), idx, vocab, t)
    assert rel_err(poisoned.to_numpy(g_wte), want_wte) <= RTOL and rel_err(poisoned.to_numpy(g_wpe), want_wpe) <= RTOL
    assert made == count


def test_an_id_out_of_range_in_the_backward_raises_at_the_read(gpu, path):
    idx = np.array([0, 2, 5, 1])  # 5: past a vocabulary of 3
    g_wte = gpu.embedding_backward(gpu.from_numpy(np.ones((4, 8), np.float32)), gpu.from_numpy(idx), 3)
    with pytest.raises(TinynnError, match="embedding: an id is outside"):
        gpu.to_numpy(g_wte)
    assert gpu.to_numpy(gpu.embedding_backward(gpu.from_numpy(np.ones((4, 8), np.float32)),
                                               gpu.from_numpy(idx % 3), 3)).sum() == 32  # raised once


@FEW
@given(batch=st.integers(1, 9), t=st.one_of(st.integers(1, 40), st.just(257)), extra=st.integers(0, 3),
       vocab=st.integers(1, 70), cols=dims, seed=st.integers(0, 2**31))
def test_embedding_with_positions(poisoned, path, batch, t, extra, vocab, cols, seed):
    """A GPT's input in one dispatch, and its two gradients in the path's one or two (the ids' sort, then the sums;
    the position rows summed over a batch shorter and longer than the four sequences a thread loads at once)."""
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
    assert count == path


@pytest.mark.parametrize("batch, t, vocab, cols", [(9, 257, 3, 40), (2, 33, 600, 70), (1, 1, 1, 1)],
                         ids=["long-runs", "one-block-a-row", "one-id"])
def test_embedding_with_positions_backward_edges(poisoned, rng, path, batch, t, vocab, cols):
    """Runs of hundreds of positions per id (a sort of 4096 pairs, most of them padding past N); a vocabulary large
    enough that each row's columns take one workgroup; a single id (GPT-2's vocabulary: the test below)."""
    idx, dy = rng.integers(0, vocab, (batch, t)), rng.standard_normal((batch, t, cols)).astype(np.float32)
    idx[0, 0] = vocab - 1
    g_wte, g_wpe = poisoned.embedding_with_positions_backward(poisoned.from_numpy(dy), poisoned.from_numpy(idx),
                                                              vocab, t + 2)
    want_wte, want_wpe = REF.embedding_with_positions_backward(dy.astype(np.float64), idx, vocab, t + 2)
    assert rel_err(poisoned.to_numpy(g_wte), want_wte) <= RTOL and rel_err(poisoned.to_numpy(g_wpe), want_wpe) <= RTOL


def test_embedding_backward_sums_in_position_order(poisoned, path):
    """Each row's gradient is its positions' rows added in position order, the same bits every run: values whose
    float32 sum depends on the order (1e8, 1, -1e8 gives 0 in this order, 1 in others) under one id, the other ids
    interleaved, run twice."""
    gpu = poisoned
    idx = np.array([2, 0, 2, 1, 2, 0])
    g = np.array([1e8, 5, 1, 7, -1e8, 3], np.float32)[:, None] * np.ones((1, 40), np.float32)
    runs = [gpu.to_numpy(gpu.embedding_backward(gpu.from_numpy(g), gpu.from_numpy(idx), 3)) for _ in range(2)]
    want = np.zeros((3, 40), np.float32)
    for i, v in enumerate(idx):  # in position order, in float32
        want[v] += g[i]
    np.testing.assert_array_equal(runs[0], want)
    np.testing.assert_array_equal(runs[1], runs[0])
