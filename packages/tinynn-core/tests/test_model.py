"""Modules, the GPT, optimizers and the learning-rate schedule."""
from collections import Counter

import numpy as np
import pytest

import tinynn
from tinynn import functional as F
from tinynn.errors import TinynnError
from tinynn import rng as tinynn_rng
from tinynn.model import GPT, GPTConfig, parameter_count
from tinynn.nn import LayerNorm, Linear
from tinynn.numpy_backend import NumpyBackend
from tinynn.optim import SGD, AdamW, cosine_lr, decay_groups
from tinynn.train_step import TrainStep
from helpers import assert_close, gradcheck

SMALL = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)


def test_attention_block_gradients_in_float64(rng):
    """The attention arithmetic as the model composes it, checked end to end by finite differences."""
    B, T, nh, hs = 2, 4, 2, 3
    x, w = rng.standard_normal((B, T, nh * hs)), rng.standard_normal((3 * nh * hs, nh * hs)) * 0.5

    def attention(x, w):
        qkv = F.linear(x, w).reshape(B, T, 3, nh, hs).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        att = F.softmax(F.matmul(qkv[0], qkv[1], transpose_b=True), causal=True, scale=1 / np.sqrt(hs))
        return (att @ qkv[2]).permute(0, 2, 1, 3).reshape(B, T, nh * hs)
    gradcheck(attention, x, w)


def test_gpt_forward_shapes_and_initial_loss(backend):
    tinynn.manual_seed(0)
    model = GPT(SMALL).to(backend)
    idx = np.random.default_rng(0).integers(0, 11, (3, 8))
    logits, loss = model(idx, idx)
    assert logits is None  # the fused classifier makes no logits
    assert model(idx)[0].shape == (3, 8, 11)
    assert abs(loss.item() - np.log(11)) < 0.1  # small init: close to uniform


def test_gpt_forward_gives_the_same_bits_with_grad_on_and_off(backend):
    """Under no_grad the forwards skip the outputs only a backward reads (backends' for_backward): the
    logits and loss must not move by a bit."""
    tinynn.manual_seed(0)
    model = GPT(SMALL).to(backend)
    idx = np.random.default_rng(1).integers(0, 11, (2, 8))
    with_grad = [model(idx)[0].numpy(), model(idx, idx)[1].numpy()]
    with tinynn.no_grad():
        without = [model(idx)[0].numpy(), model(idx, idx)[1].numpy()]
    for a, b in zip(with_grad, without):
        np.testing.assert_array_equal(a, b)


def test_gpt_is_causal(backend):
    tinynn.manual_seed(0)
    model = GPT(SMALL).to(backend)
    idx = np.random.default_rng(1).integers(0, 11, (1, 8))
    changed = idx.copy()
    changed[0, 5:] = (changed[0, 5:] + 1) % 11
    a, b = model(idx)[0].numpy(), model(changed)[0].numpy()
    assert_close(a[0, :5], b[0, :5], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a[0, 5:], b[0, 5:])


def test_classifier_is_the_head_and_its_cross_entropy(backend, rng):
    """F.classifier against its composition, linear then cross_entropy: the loss and all three gradients, with an
    ignored row, a gradient other than 1 reaching the loss, and rows in (B, T) shape."""
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 5, 7), (13, 7), (13,)))
    t = rng.integers(0, 13, (2, 5))
    t[1, 2] = -100
    losses, grads = [], []
    for fused in (True, False):
        xs, ws, bs = (tinynn.tensor(a, requires_grad=True, backend=backend) for a in (x, w, b))
        loss = F.classifier(xs, ws, bs, t) if fused else F.cross_entropy(F.linear(xs, ws, bs), t)
        (loss * 3.0).backward()
        losses.append(loss.numpy())
        grads.append([a.grad.numpy() for a in (xs, ws, bs)])
    assert_close(losses[0], losses[1], rtol=1e-5)
    for ours, theirs, name in zip(grads[0], grads[1], ("x", "weight", "bias")):
        assert_close(ours, theirs, rtol=1e-5, atol=1e-7, what=name)


class CountingReference(NumpyBackend):
    """The NumPy reference, counting its elementwise ops (by name) and fills."""
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def binary(self, op, a, b):
        self.ops[op] += 1
        return super().binary(op, a, b)

    def full(self, shape, value, dtype=np.float32):
        self.ops["full"] += 1
        return super().full(shape, value, dtype)


def test_classifier_backward_from_backwards_own_seed_multiplies_nothing(rng):
    """loss.backward() on the fused classifier's loss hands on the gradients its forward made, neither a seed of
    one made nor multiplied in; a gradient of 0.5 given for the loss still halves them."""
    be = CountingReference()
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4, 6), (9, 6), (9,)))
    t = rng.integers(0, 9, (3, 4))
    grads = []
    for seed in (None, tinynn.tensor(np.float32(0.5), backend=be)):
        xs, ws, bs = (tinynn.tensor(a, requires_grad=True, backend=be) for a in (x, w, b))
        loss = F.classifier(xs, ws, bs, t)
        be.ops.clear()
        loss.backward(seed)
        grads.append([a.grad.numpy() for a in (xs, ws, bs)])
        assert be.ops == (Counter() if seed is None else Counter(mul=3))
    for unit, half, name in zip(*grads, ("x", "weight", "bias")):
        assert_close(half, 0.5 * unit, rtol=1e-6, what=name)


def test_a_train_step_at_scale_one_makes_no_seed_and_no_multiply():
    """A TrainStep without accumulation starts the backward from backward()'s own seed: the step's only
    multiplies are the model's own (none in the GPT, whose ops are fused), and it fills nothing."""
    be = CountingReference()
    tinynn.manual_seed(0)
    model = GPT(SMALL).to(be)
    step = TrainStep(model, AdamW(model.parameters()), 2, SMALL.block_size)
    x = np.arange(2 * SMALL.block_size).reshape(2, SMALL.block_size) % SMALL.vocab_size
    step(x, x, 1e-3).item()  # (the optimizer fills its state in the first)
    be.ops.clear()
    step(x, x, 1e-3).item()
    assert be.ops["mul"] == 0 and be.ops["full"] == 0, be.ops


def test_classifier_masks_the_padded_columns(backend, rng):
    """With vocab < the head's rows, the padded columns take no probability: the loss is the one over the first vocab
    columns alone, and their rows of the weight and bias get no gradient."""
    x, w = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    w[11:] *= 100  # padded logits that would dominate a softmax over every column
    t = rng.integers(0, 11, 6)
    xs, ws, bs = (tinynn.tensor(a, requires_grad=True, backend=backend) for a in (x, w, b))
    loss = F.classifier(xs, ws, bs, t, vocab=11)
    loss.backward()
    logits = (x @ w[:11].T + b[:11]).astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    assert_close(loss.item(), (lse - logits[np.arange(6), t]).mean(), rtol=1e-5)
    assert not ws.grad.numpy()[11:].any() and not bs.grad.numpy()[11:].any()
    with pytest.raises(TinynnError, match="target"):
        F.classifier(xs, ws, bs, np.full(6, 11), vocab=11).item()  # a padded column is no class


def test_classifier_gradients_in_float64(rng):
    """The fused classifier's gradients by finite differences, padded columns, an ignored row and no bias included."""
    t = np.array([3, 0, -100, 4])
    gradcheck(lambda x, w, b: F.classifier(x, w, b, t, vocab=5), rng.standard_normal((4, 3)),
              rng.standard_normal((7, 3)), rng.standard_normal(7))
    gradcheck(lambda x, w: F.classifier(x, w, None, t, vocab=5), rng.standard_normal((4, 3)),
              rng.standard_normal((7, 3)))


def test_padded_vocabulary(backend):
    """vocab_multiple pads the token table and the head to a multiple; the model still predicts vocab_size tokens:
    its logits, a generation's and the loss (uniform at the start) are over the real vocabulary only."""
    config = GPTConfig(**{**SMALL.__dict__, "vocab_multiple": 8})
    assert config.padded_vocab_size == 16
    tinynn.manual_seed(0)
    model = GPT(config).to(backend)
    assert model.wte.weight.shape == (16, 16) and model.lm_head.weight.shape == (16, 16)
    with tinynn.no_grad():
        model.lm_head.bias.data = backend.from_numpy(np.r_[np.zeros(11), np.full(5, 50.0)].astype(np.float32))
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))
    assert model(idx)[0].shape == (2, 8, 11)
    assert abs(model(idx, idx)[1].item() - np.log(11)) < 0.1
    assert model.generate(idx[:, :2], 5, temperature=0).max() < 11
    with pytest.raises(TinynnError, match="vocab_multiple"):
        GPT(GPTConfig(**{**SMALL.__dict__, "vocab_multiple": 0}))


def test_gpt_rejects_sequences_longer_than_block():
    with pytest.raises(ValueError, match="block_size"):
        GPT(SMALL)(np.zeros((1, 9), dtype=np.int64))


def test_state_dict_roundtrip_and_mismatch():
    tinynn.manual_seed(0)
    a = GPT(SMALL)
    tinynn.manual_seed(1)
    b = GPT(SMALL)
    b.load_state_dict(a.state_dict())
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
    state = a.state_dict()
    state["lm_head.weight"] = state["lm_head.weight"][:, :3]
    with pytest.raises(TinynnError, match="lm_head.weight has shape"):
        b.load_state_dict(state)
    with pytest.raises(TinynnError, match="missing"):
        b.load_state_dict({})


def test_parameter_names_and_bias_option():
    names = [n for n, _ in GPT(SMALL).named_parameters()]
    assert names[:3] == ["wte.weight", "wpe.weight", "blocks.0.ln1.weight"]
    assert "blocks.1.mlp.fc.bias" in names
    nobias = GPT(GPTConfig(**{**SMALL.__dict__, "bias": False}))
    assert not any(n.endswith(".bias") for n, _ in nobias.named_parameters())


def test_parameter_count_is_the_models_and_builds_nothing():
    """Counted from the definition: as many as the built model has, GPT-2 small's 124,439,808 plus the untied
    head's weight and bias, and no draw from the generator (a run's weights stay what its seed makes them)."""
    for bias in (True, False):
        config = GPTConfig(**{**SMALL.__dict__, "bias": bias})
        assert parameter_count(config) == sum(p.size for p in GPT(config).parameters())
    tinynn.manual_seed(3)
    before = tinynn_rng.get_state()
    gpt2 = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    assert parameter_count(gpt2) == 124_439_808 + 50257 * 768 + 50257
    assert tinynn_rng.get_state() == before


def test_train_eval_switches_dropout():
    model = GPT(GPTConfig(**{**SMALL.__dict__, "dropout": 0.5}))
    idx = np.zeros((1, 8), dtype=np.int64)
    model.eval()
    np.testing.assert_array_equal(model(idx)[0].numpy(), model(idx)[0].numpy())
    model.train()
    assert not np.array_equal(model(idx)[0].numpy(), model(idx)[0].numpy())


def test_gpt_learns_a_repeating_sequence(backend):
    tinynn.manual_seed(0)
    model = GPT(SMALL).to(backend)
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    seq = np.arange(9) % 11
    x, y = seq[None, :8], seq[None, 1:]
    for _ in range(60):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    assert model.generate(x[:, :1], 7, temperature=0)[0].tolist() == seq[:8].tolist()


def adamw_reference(p, g, steps, lr, b1, b2, eps, wd):
    m = v = np.zeros_like(p)
    for t in range(1, steps + 1):
        p = p * (1 - lr * wd)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return p


def test_adamw_matches_the_paper(backend, rng):
    p0, g = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    p = tinynn.tensor(p0, requires_grad=True, backend=backend)
    opt = AdamW([p], lr=0.1, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for _ in range(3):
        p.grad = tinynn.tensor(g, backend=backend)
        opt.step()
    expected = adamw_reference(p0.astype(np.float64), g, 3, 0.1, 0.9, 0.95, 1e-8, 0.1)
    assert_close(p.numpy(), expected, rtol=1e-5, atol=1e-6)  # atol: float32 rounding where p crosses 0


def test_adamw_updates_groups_that_differ_only_in_weight_decay_together(backend, rng):
    """nanoGPT's two groups are one adamw_update_ call, each parameter with its group's decay; a group with
    another learning rate is a call of its own."""
    p0, g = rng.standard_normal((3, 4, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    ps = [tinynn.tensor(x, requires_grad=True, backend=backend) for x in p0]
    opt = AdamW([{"params": ps[:1], "weight_decay": 0.1}, {"params": ps[1:2], "weight_decay": 0.0},
                 {"params": ps[2:], "weight_decay": 0.0, "lr": 0.05}], lr=0.1, betas=(0.9, 0.95), eps=1e-8)
    calls, plain = [], backend.adamw_update_
    backend.adamw_update_ = lambda *args, **kwargs: calls.append(kwargs["weight_decay"]) or plain(*args, **kwargs)
    writes, plain_write = [], backend.write_
    backend.write_ = lambda dst, src: writes.append(dst) or plain_write(dst, src)
    try:
        for _ in range(3):
            for p in ps:
                p.grad = tinynn.tensor(g, backend=backend)
            opt.step()
    finally:
        del backend.adamw_update_, backend.write_
    assert calls == [[0.1, 0.0], [0.0]] * 3
    assert len(writes) == 2 * 2  # the per-step values of each run, once a step after the first (which makes them)
    for p, x, lr, decay in zip(ps, p0, (0.1, 0.1, 0.05), (0.1, 0.0, 0.0)):
        assert_close(p.numpy(), adamw_reference(x.astype(np.float64), g, 3, lr, 0.9, 0.95, 1e-8, decay),
                     rtol=1e-5, atol=1e-6)


def test_sgd_momentum(backend):
    p = tinynn.tensor([1.0], requires_grad=True, backend=backend)
    opt = SGD([p], lr=0.1, momentum=0.9)
    for _ in range(2):
        p.grad = tinynn.tensor([1.0], backend=backend)
        opt.step()
    assert_close(p.numpy(), [1.0 - 0.1 - 0.19], rtol=1e-6)


def test_gradient_clipping(backend):
    p = tinynn.tensor([0.0, 0.0], requires_grad=True, backend=backend)
    opt = SGD([p], lr=1.0, max_grad_norm=1.0)
    p.grad = tinynn.tensor([3.0, 4.0], backend=backend)
    opt.step()
    assert_close(opt.last_grad_norm.item(), 5.0, rtol=1e-6)
    assert_close(p.numpy(), [-0.6, -0.8], rtol=1e-5)


def test_decay_groups_and_optimizer_state_roundtrip():
    model = GPT(SMALL)
    groups = decay_groups(list(model.named_parameters()), 0.1)
    assert all(p.ndim >= 2 for p in groups[0]["params"]) and all(p.ndim == 1 for p in groups[1]["params"])
    opt = AdamW(groups, lr=1e-3)
    _, loss = model(np.zeros((1, 8), dtype=np.int64), np.zeros((1, 8), dtype=np.int64))
    loss.backward()
    opt.step()
    state = opt.state_dict()
    fresh = AdamW(decay_groups(list(model.named_parameters()), 0.1), lr=1e-3)
    fresh.load_state_dict(state)
    assert fresh.steps == 1 and len(fresh.state) == len(opt.state)


def test_cosine_schedule():
    lrs = [cosine_lr(s, 1.0, 0.1, 10, 110) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55)
    assert lrs[110] == lrs[119] == 0.1
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))


def test_linear_and_layernorm_modules(rng):
    lin, ln = Linear(4, 3), LayerNorm(3)
    x = tinynn.tensor(rng.standard_normal((2, 4)).astype(np.float32))
    y = ln(lin(x))
    assert y.shape == (2, 3)
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]


def test_calling_a_module_runs_its_forward_unless_a_call_is_written_by_hand():
    """A module's class gets its forward as `__call__` (one frame fewer per call), but a `__call__` written in the
    class or a base class still runs, for the class and its subclasses."""
    from tinynn.nn import Module

    class Plain(Module):
        def forward(self, x):
            return ("forward", x)

    class Counted(Module):
        def __call__(self, x):
            return ("call", self.forward(x))

        def forward(self, x):
            return x + 1

    class Child(Counted):
        def forward(self, x):
            return x + 2

    class Grandchild(Plain):
        def forward(self, x):
            return ("grandchild", x)
    assert Plain()(1) == ("forward", 1) and Plain.__call__ is Plain.forward
    assert Counted()(1) == ("call", 2)
    assert Child()(1) == ("call", 3)
    assert Grandchild()(1) == ("grandchild", 1)
    assert Linear(2, 3).__call__.__func__ is Linear.forward
