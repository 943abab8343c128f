"""The fused classifier (ops/cross_entropy.py's classifier_forward) against NumPy, outputs poisoned with NaN: the loss
and the head's three gradients, over one chunk of rows and several, padded columns and ignored rows; and a GPT's
training step at GPT-2's vocabulary that runs no op on the CPU."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinynn import backends, rng as tinynn_rng
from tinynn.errors import TinynnError
from tinynn.model import GPT, GPTConfig
from tinynn.optim import AdamW
from tinynn.train_step import TrainStep
from tinynn_gpu.ops import cross_entropy

from gpu_checks import rel_err

RTOL = 1e-5
REF = backends.reference()


def check(gpu, x, w, b, t, vocab, for_backward=True):
    """The GPU's classifier_forward against the reference's in float64; the GPU's results."""
    ours = cross_entropy.classifier_forward(gpu, gpu.from_numpy(x), gpu.from_numpy(w),
                                            None if b is None else gpu.from_numpy(b), gpu.from_numpy(t), vocab, -100,
                                            for_backward)
    theirs = REF.classifier_forward(x.astype(np.float64), w.astype(np.float64),
                                    None if b is None else b.astype(np.float64), t, vocab, -100, for_backward)
    ours = [None if a is None else gpu.to_numpy(a) for a in ours]
    for name, o, r in zip(("loss", "g_x", "g_weight", "g_bias"), ours, theirs):
        assert (o is None) == (r is None), name
        if r is not None and np.isnan(r).all():  # no valid target: the loss is NaN on both
            assert np.isnan(o).all(), name
        elif r is not None:
            assert rel_err(o, r) <= RTOL, name
    return ours


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), c=st.integers(1, 70), vocab=st.integers(1, 300), pad=st.integers(0, 70),
       chunk_rows=st.sampled_from([1, 3, 8, None]), bias=st.booleans(), seed=st.integers(0, 2**31))
def test_classifier_forward(subgroup_path, monkeypatch, n, c, vocab, pad, chunk_rows, bias, seed):
    """Any shape, in one chunk or in chunks of a few rows, padded columns and an ignored row included; under no_grad
    the same loss, to the bit, and no gradients."""
    gpu, g = subgroup_path, np.random.default_rng(seed)
    x, w = g.standard_normal((n, c)).astype(np.float32), g.standard_normal((vocab + pad, c)).astype(np.float32)
    b = g.standard_normal(vocab + pad).astype(np.float32) if bias else None
    t = g.integers(0, vocab, n)
    if n > 1:  # (every row ignored is test_classifier_forward_edges')
        t[g.integers(0, n)] = -100
    if chunk_rows is not None:
        monkeypatch.setattr(cross_entropy, "chunk_rows", lambda rt, v_padded: chunk_rows)
    before = dict(gpu.fallbacks)
    loss, *_ = check(gpu, x, w, b, t, vocab)
    no_grad, *rest = check(gpu, x, w, b, t, vocab, for_backward=False)
    np.testing.assert_array_equal(no_grad, loss)
    assert dict(gpu.fallbacks) == before  # the head's products and the rows' copies included


def test_classifier_forward_edges(poisoned):
    """Every row ignored (the loss NaN as PyTorch's, the gradients zero); a target in the padding is an error."""
    gpu, g = poisoned, np.random.default_rng(0)
    x, w = g.standard_normal((5, 4)).astype(np.float32), g.standard_normal((9, 4)).astype(np.float32)
    loss, g_x, g_w, _ = check(gpu, x, w, None, np.full(5, -100), 7)
    assert np.isnan(loss) and not g_x.any() and not g_w.any()
    with pytest.raises(TinynnError, match="target"):
        gpu.to_numpy(cross_entropy.classifier_forward(gpu, gpu.from_numpy(x), gpu.from_numpy(w), None,
                                                      gpu.from_numpy(np.array([0, 1, 7, 2, 3])), 7, -100)[0])


def test_a_training_step_at_gpt2_vocabulary_runs_no_op_on_the_cpu(gpu, monkeypatch):
    """A small GPT with GPT-2's padded vocabulary (50257 in a head of 50304), its batch's logits over the binding
    limit (lowered to 32 MiB, so the shapes stay small on any adapter): the training step runs every op on the GPU
    (no NumPy fallback counted), and its losses are the CPU's."""
    monkeypatch.setattr(gpu.rt, "max_binding", 32 << 20)
    config = GPTConfig(vocab_size=50257, vocab_multiple=64, n_embd=32, n_head=2, n_layer=1, block_size=64)
    batch = np.random.default_rng(0).integers(0, 50257, (4, 65))
    assert 4 * 64 * 4 * config.padded_vocab_size > 32 << 20
    losses = {}
    for backend in (REF, gpu):
        tinynn_rng.manual_seed(0)
        model = GPT(config).to(backend)
        step = TrainStep(model, AdamW(model.parameters(), lr=1e-3), 4, 64)
        before = dict(backend.fallbacks)
        losses[backend.name] = [step(batch[:, :-1], batch[:, 1:], 1e-3).item() for _ in range(3)]
        assert dict(backend.fallbacks) == before
    np.testing.assert_allclose(losses["gpu"], losses["cpu"], rtol=1e-4)
