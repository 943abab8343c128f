"""TrainStep's guard key (what a captured step fixes when it records: the model's mode, each parameter's
array, a module assigned after the step was built) and its batches, once per backend."""
import numpy as np

import tinynn
from tinynn.model import GPT
from tinynn.nn import Linear
from tinynn.optim import AdamW
from tinynn.train_step import TrainStep
from test_optim import CFG, differ


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
