"""Gradient accumulation and the data-parallel step, once per backend (on the GPU: captured and replayed).

A step over k micro-batches equals one step over their concatenation; the data-parallel step (gradients
packed into one flat array, summed over the ranks, unpacked) equals the single-process step on the same
rows. The ranks are stood in for by a world whose sum doubles the array: two ranks that drew the same rows.
"""
import numpy as np
import pytest

import tinynn
from tinynn.config import from_dict
from tinynn.distributed import World
from tinynn.model import GPT, GPTConfig
from tinynn.optim import AdamW, decay_groups
from tinynn.train_step import TrainStep

# bias=False: attention's key bias has an exactly zero gradient, so Adam turns its rounding noise into
# lr-sized steps that differ between any two summation orders; no other parameter is that fragile
CFG = GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=16, bias=False)
BATCH, STEPS = 8, 7  # on the GPU, steps 4+ are captured and 5+ replayed


class Twin(World):
    """A world of two ranks that hold the same rows: their sum is twice this rank's share."""

    def allreduce_(self, array):
        array *= 2


def run(backend, accum_steps=1, world=None):
    tinynn.manual_seed(0)
    model = GPT(CFG).to(backend)
    opt = AdamW(decay_groups(list(model.named_parameters()), 0.1), lr=1e-2, max_grad_norm=0.5)
    step = TrainStep(model, opt, BATCH, CFG.block_size, accum_steps, world)
    data = np.random.default_rng(0)
    losses = []
    for i in range(STEPS):
        seq = (data.integers(0, CFG.vocab_size, (BATCH, 1)) + np.arange(CFG.block_size + 1)) % CFG.vocab_size
        losses.append(step(seq[:, :-1], seq[:, 1:], 1e-2 * (1 - i / STEPS)).item())
    return losses, {name: p.numpy() for name, p in model.named_parameters()}


def assert_same_run(a, b, rtol):
    np.testing.assert_allclose(a[0], b[0], rtol=rtol)
    for name in a[1]:
        diff = np.linalg.norm(a[1][name] - b[1][name]) / np.linalg.norm(b[1][name])
        assert diff <= rtol, f"{name}: relative difference {diff:.2e}"


def replays(backend):
    return backend.counters["replays"] if backend.is_gpu else 0


@pytest.mark.parametrize("accum_steps", [2, 4])
def test_accumulated_micro_batches_equal_one_batch(backend, accum_steps):
    whole = run(backend)
    before = replays(backend)
    accumulated = run(backend, accum_steps)
    if backend.is_gpu:
        assert replays(backend) - before == STEPS - 4  # the accumulating step is captured too
    assert_same_run(accumulated, whole, rtol=1e-5)


@pytest.mark.parametrize("accum_steps", [1, 2])
def test_data_parallel_step_equals_the_single_process_step(backend, accum_steps):
    single = run(backend, accum_steps)
    syncs, before = backend.counters.get("host_syncs", 0) if backend.is_gpu else 0, replays(backend)
    parallel = run(backend, accum_steps, Twin(rank=0, size=2))
    if backend.is_gpu:  # both halves replayed; one read-back a step (the flat gradients, which hold the loss)
        assert replays(backend) - before == 2 * (STEPS - 4)
        assert backend.counters["host_syncs"] - syncs == STEPS + len(parallel[1])  # + reading the weights
    assert_same_run(parallel, single, rtol=1e-5)


def test_batch_must_split_over_ranks_and_micro_batches():
    with pytest.raises(tinynn.TinynnError, match=r"batch_size \(6\) must be divisible by the number of ranks "
                                                 r"\(2\) times grad_accum_steps \(2\)"):
        World(rank=0, size=2).check_batch(6, 2)
    World(rank=1, size=2).check_batch(8, 2)
    assert World(rank=1, size=3).rows(np.arange(9)).tolist() == [1, 4, 7]


def test_grad_accum_steps_is_checked_by_name():
    with pytest.raises(tinynn.TinynnError, match="'grad_accum_steps' must be at least 1, got 0"):
        from_dict({"grad_accum_steps": 0})
    with pytest.raises(tinynn.TinynnError, match=r"'batch_size' \(6\) must be divisible by grad_accum_steps \(4\)"):
        from_dict({"batch_size": 6, "grad_accum_steps": 4})
