"""The optimizers' guard key (what a captured training step fixes when it records, optim.py) and its runs of
groups updated together, once per backend. The key is computed before every replayed step, so it is kept
cheap; these tests fail if a cheaper key stops seeing something a replay baked in."""
import numpy as np
import pytest

import tinynn
from tinynn.model import GPT, GPTConfig
from tinynn.optim import SGD, AdamW, decay_groups
from tinynn.train import TrainStep

CFG = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16)


def stepped(backend, make):
    """An optimizer over a seeded GPT's decay groups, after one step (its state and per-step arrays made)."""
    tinynn.manual_seed(0)
    model = GPT(CFG).to(backend)
    opt = make(decay_groups(list(model.named_parameters()), 0.1))
    for p in opt.params:
        p.grad = tinynn.tensor(np.ones(p.shape, np.float32), backend=backend)
    opt.step()
    return opt


def differ(a, b) -> bool:
    """a != b as a replaying backend compares its keys (capture.py): arrays by identity, where the CPU
    backend's NumPy arrays would compare elementwise."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is not type(b) or len(a) != len(b) or any(differ(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() != b.keys() or any(differ(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return a is not b
    return a != b


OPTIMIZERS = {"adamw": lambda groups: AdamW(groups, lr=1e-3, max_grad_norm=1.0),
              "sgd": lambda groups: SGD(groups, lr=1e-2, momentum=0.9)}


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_the_key_sees_every_hyperparameter_but_the_learning_rate(backend, kind):
    opt = stepped(backend, OPTIMIZERS[kind])
    key = opt.guard_key()
    opt.set_lr(0.5)  # written every step: not part of the key
    assert not differ(opt.guard_key(), key)
    for g in opt.groups:
        for name in [k for k in g if k not in ("params", "lr")]:  # every field, the ones added later too
            kept = g[name]
            g[name] = (kept, "changed")
            assert differ(opt.guard_key(), key), f"the key misses a change of {name!r}"
            g[name] = kept
            assert not differ(opt.guard_key(), key)
        g["added_later"] = 1.0
        assert differ(opt.guard_key(), key), "the key misses a field added to a group"
        del g["added_later"]
    opt.max_grad_norm = 2.0
    assert differ(opt.guard_key(), key)


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_the_key_sees_each_state_and_per_step_array_by_identity(backend, kind):
    opt = stepped(backend, OPTIMIZERS[kind])
    key = opt.guard_key()
    buffers = next(iter(opt.state.values()))
    kept = buffers[-1]
    buffers[-1] = backend.full((1,), 0.0)  # swapped inside the list the key walked
    assert differ(opt.guard_key(), key)
    buffers[-1] = kept
    assert not differ(opt.guard_key(), key)
    opt.load_state_dict(opt.state_dict())  # the same values in new arrays
    assert differ(opt.guard_key(), key)
    key = opt.guard_key()
    be, values = opt.groups[0]["hyper"]
    opt.groups[0]["hyper"] = (be, be.from_numpy(be.to_numpy(values)))
    assert differ(opt.guard_key(), key)


def test_groups_that_differ_only_in_weight_decay_update_in_one_run(backend):
    opt = stepped(backend, OPTIMIZERS["adamw"])
    assert [len(run) for run in opt._update_runs()] == [2]
    key = opt.guard_key()
    opt.groups[1]["betas"] = (0.5, 0.6)
    assert [len(run) for run in opt._update_runs()] == [1, 1]
    opt.groups[1]["betas"] = opt.groups[0]["betas"]
    opt.groups[1]["amsgrad"] = False  # a field one group has and the other lacks
    assert [len(run) for run in opt._update_runs()] == [1, 1]
    del opt.groups[1]["amsgrad"]
    opt.groups[1]["lr"] = 0.5  # not in the key itself, but it splits the run, which is
    assert differ(opt.guard_key(), key)
    opt.set_lr(1e-3)
    assert not differ(opt.guard_key(), key)
    emptied, opt.groups[1]["params"] = opt.groups[1]["params"], []
    assert differ(opt.guard_key(), key)
    opt.groups[1]["params"] = emptied


def test_a_train_steps_key_sees_the_mode_and_each_parameters_array(backend):
    tinynn.manual_seed(0)
    model = GPT(CFG).to(backend)
    step = TrainStep(model, AdamW(model.parameters()), 2, CFG.block_size)
    key = step._guard_key()
    model.eval()
    assert differ(step._guard_key(), key)
    model.train()
    assert not differ(step._guard_key(), key)
    for p in step.model_params:  # each one: a key that walked only some parameters fails here
        kept, p.data = p.data, backend.full(p.shape, 0.0)
        assert differ(step._guard_key(), key)
        p.data = kept
    assert not differ(step._guard_key(), key)


def test_a_train_steps_key_sees_a_module_assigned_after_it_was_built(backend):
    """A new head (or any tensor, module or list assigned to a module) is walked into the key: a replay of the step
    captured before it would still compute with the old one."""
    from tinynn.nn import Linear
    tinynn.manual_seed(0)
    model = GPT(CFG).to(backend)
    step = TrainStep(model, AdamW(model.parameters()), 2, CFG.block_size)
    key = step._guard_key()
    assert not differ(step._guard_key(), key)
    model.lm_head = Linear(CFG.n_embd, CFG.vocab_size).to(backend)
    assert differ(step._guard_key(), key)
    assert any(p is model.lm_head.weight for p in step.model_params)  # `in` would compare values (==)


def test_a_head_replaced_after_the_step_was_captured_trains_as_a_new_step_does(backend):
    """The step after a new head computes with it: the same losses as a TrainStep built after the change."""
    from tinynn.nn import Linear
    x = np.arange(2 * CFG.block_size).reshape(2, CFG.block_size) % CFG.vocab_size
    y = (x + 1) % CFG.vocab_size
    losses = []
    for rebuilt in (False, True):
        tinynn.manual_seed(0)
        model = GPT(CFG).to(backend)
        opt = AdamW(model.parameters(), lr=1e-2)
        step = TrainStep(model, opt, 2, CFG.block_size)
        for _ in range(6):  # past the eager calls: the step is captured (on a backend that captures)
            step(x, y, 1e-2).item()
        head = Linear(CFG.n_embd, CFG.vocab_size).to(backend)
        head.weight.data = backend.from_numpy(np.full(head.weight.shape, 0.5, np.float32))
        model.lm_head = head
        if rebuilt:
            step = TrainStep(model, opt, 2, CFG.block_size)
        losses.append([step(x, y, 1e-2).item() for _ in range(3)])
    assert losses[0] == losses[1]


def test_a_batch_given_as_lists_trains_as_the_same_arrays_do(backend):
    losses = []
    for as_lists in (False, True):
        tinynn.manual_seed(0)
        model = GPT(CFG).to(backend)
        step = TrainStep(model, AdamW(model.parameters(), lr=1e-2), 2, CFG.block_size)
        x = np.arange(2 * CFG.block_size).reshape(2, CFG.block_size) % CFG.vocab_size
        y = (x + 1) % CFG.vocab_size
        losses.append([step(*((x.tolist(), y.tolist()) if as_lists else (x, y)), 1e-2).item() for _ in range(6)])
    assert losses[0] == losses[1]
