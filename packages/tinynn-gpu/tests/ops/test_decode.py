"""The generation kernels (ops/decode.wgsl) against the NumPy reference, outputs poisoned with NaN, shapes
drawn by hypothesis: lengths below and past block_size, caches longer than one 256-key chunk, vocabularies
smaller and larger than a workgroup. Then a whole generation on the GPU: captured steps replayed, the same tokens
as the CPU. Decoding's few-row matmul is tested in matmul/test_rows.py."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinynn
from tinynn import backends
from tinynn.model import GPT, GPTConfig

REF = backends.reference()
SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def both(gpu, *arrays):
    """Each array on the CPU and on the GPU."""
    return [(a, gpu.from_numpy(a)) for a in arrays]


def assert_close(actual, expected, rtol=1e-5):
    assert actual.shape == expected.shape and np.isfinite(actual).all(), "unwritten (NaN) elements"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(1.0, float(np.abs(expected).max())))


@SETTINGS
@given(batch=st.integers(1, 3), block=st.integers(1, 9), extra=st.integers(0, 20), ring_extra=st.integers(0, 5),
       c=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_embed_window(poisoned, batch, block, extra, ring_extra, c, seed):
    g = np.random.default_rng(seed)
    n = int(g.integers(1, block + extra + 1))
    count = int(g.integers(1, min(n, block) + 1))
    vocab, ring = 7, block + ring_extra
    wte, wpe = g.standard_normal((vocab, c)).astype(np.float32), g.standard_normal((block, c)).astype(np.float32)
    tokens, length = g.integers(0, vocab, (batch, ring)).astype(np.int32), np.array([n], np.int32)
    expected = REF.embed_window(wte, wpe, tokens, length, count)
    actual = poisoned.embed_window(*(poisoned.from_numpy(a) for a in (wte, wpe, tokens, length)), count)
    assert_close(poisoned.to_numpy(actual), expected)


@SETTINGS
@given(batch=st.integers(1, 3), block=st.integers(1, 12), c=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_kv_cache_write(poisoned, batch, block, c, seed):
    g = np.random.default_rng(seed)
    n = int(g.integers(1, 2 * block + 1))
    count = int(g.integers(1, min(n, block) + 1))
    k, v = g.standard_normal((2, batch, block, c)).astype(np.float32)
    qkv, length = g.standard_normal((batch, count, 3 * c)).astype(np.float32), np.array([n], np.int32)
    (k, dk), (v, dv), (qkv, dqkv), (length, dlength) = both(poisoned, k, v, qkv, length)
    REF.kv_cache_write_(k, v, qkv, length)
    poisoned.kv_cache_write_(dk, dv, dqkv, dlength)
    assert_close(poisoned.to_numpy(dk), k, rtol=0)
    assert_close(poisoned.to_numpy(dv), v, rtol=0)


@SETTINGS
@given(batch=st.integers(1, 3), n_head=st.integers(1, 4), hs=st.sampled_from([1, 3, 8, 16, 48, 64, 300]),
       block=st.one_of(st.integers(1, 20), st.integers(250, 600)), seed=st.integers(0, 2**31))
def test_attention_decode(poisoned, batch, n_head, hs, block, seed):
    g = np.random.default_rng(seed)
    c, n = n_head * hs, int(g.integers(1, block + 5))
    k, v = (2 * g.standard_normal((2, batch, block, c))).astype(np.float32)
    qkv, length = (2 * g.standard_normal((batch, 1, 3 * c))).astype(np.float32), np.array([n], np.int32)
    expected = REF.attention_decode(*(a.astype(np.float64) for a in (qkv, k, v)), length, n_head, hs ** -0.5)
    actual = poisoned.attention_decode(*(poisoned.from_numpy(a) for a in (qkv, k, v, length)), n_head, hs ** -0.5)
    assert_close(poisoned.to_numpy(actual), expected, rtol=2e-5)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 4), vocab=st.one_of(st.integers(1, 40), st.integers(250, 700)),
       temperature=st.sampled_from([0.0, 0.5, 1.0, 3.0]), top_k=st.integers(1, 800), seed=st.integers(0, 2**32 - 1),
       n=st.integers(1, 2**31 - 1), data=st.integers(0, 2**31))
def test_sample_tokens(gpu, batch, vocab, temperature, top_k, seed, n, data):
    g = np.random.default_rng(data)
    logits = (3 * g.standard_normal((batch, vocab))).astype(np.float32)
    logits[:, g.integers(0, vocab)] = logits.max()  # a tie for the largest: the first one wins
    ring = 5
    tokens, length, ids = g.integers(0, 9, (batch, ring)).astype(np.int32), np.array([n], np.int32), \
        np.full(batch, -1, np.int32)
    (logits, dlogits), (tokens, dtokens), (length, dlength), (ids, dids) = both(gpu, logits, tokens, length, ids)
    kwargs = {"temperature": temperature, "top_k": top_k, "seed": seed}
    REF.sample_tokens_(logits, tokens, length, ids, **kwargs)
    gpu.sample_tokens_(dlogits, dtokens, dlength, dids, **kwargs)
    drawn = gpu.to_numpy(dids)
    for row in np.flatnonzero(drawn != ids):  # the GPU sums p in another order: only a boundary may move
        assert temperature > 0 and on_a_boundary(logits[row], temperature, top_k, seed, row, n, drawn[row], ids[row])
    tokens[:, n % ring] = drawn
    np.testing.assert_array_equal(gpu.to_numpy(dtokens), tokens)  # the draw at slot n % ring, the rest kept


def on_a_boundary(logits, temperature, top_k, seed, row, n, a, b) -> bool:
    """Whether u * sum(p) lies within rounding of the running sum that separates tokens a and b."""
    from tinynn.numpy_backend import uniform
    x = logits.astype(np.float64)
    kept = x >= np.sort(x)[len(x) - min(top_k, len(x))]
    running = np.cumsum(np.where(kept, np.exp((x - x.max()) / temperature), 0.0))
    goal = float(uniform(seed, np.array([row]), n)[0]) * running[-1]
    return abs(running[min(a, b)] - goal) <= 1e-5 * running[-1]


def test_advance(gpu):
    length = gpu.from_numpy(np.array([41], np.int32))
    gpu.advance_(length)
    gpu.advance_(length)
    assert gpu.to_numpy(length).tolist() == [43]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_replays_its_steps_and_matches_the_cpu(gpu, temperature):
    tinynn.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16)).to("cpu")
    for p in model.parameters():
        if p.ndim == 2:  # logits far apart: the CPU's and the GPU's rounding cannot change a choice
            p.backend.write_(p.data, p.numpy() * 20)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    expected = model.generate(prompt, 20, temperature=temperature, top_k=5, seed=7)
    model.to(gpu)
    replays = gpu.counters["replays"]
    np.testing.assert_array_equal(model.generate(prompt, 20, temperature=temperature, top_k=5, seed=7), expected)
    assert gpu.counters["replays"] - replays >= 10  # the window steps past their 3 eager calls and capture
