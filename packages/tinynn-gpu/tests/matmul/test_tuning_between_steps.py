"""Matmul tuning in a training loop (matmul/selection.py, `defer`): the first step runs on the default variants at
once, the tuning runs between steps with a line on stderr, and the tuned kernels then run in the replayed step,
with the losses of an untuned run. lavapipe tunes only when told to (TINYNN_AUTOTUNE=1)."""
import json

import numpy as np
import pytest

import tinynn
from tinynn.model import GPT, GPTConfig
from tinynn.optim import AdamW, decay_groups
from tinynn.train import TrainStep
from tinynn_gpu.matmul.selection import MatmulSelector

CFG = GPTConfig(vocab_size=13, block_size=16, n_layer=1, n_head=2, n_embd=32)
# what the tuning may choose: two defaults of this model's shapes, and a variant no default is
CANDIDATES = ["blocked 32x64x16/4x4", "blocked 64x64x16/4x4", "blocked 128x64x16/8x8 vec4 db"]
TUNED = CANDIDATES[-1]


def selector(gpu, monkeypatch, autotune: bool) -> MatmulSelector:
    """The backend's selector replaced by a fresh one (tuning as on a hardware adapter, or not), which tunes every
    shape among a few candidates."""
    mm = MatmulSelector(gpu.rt, autotune=autotune)
    mm.tune_min_macs = 0
    mm.candidates = CANDIDATES
    mm.pair_candidates = dict(list(mm.pair_candidates.items())[:2])
    monkeypatch.setattr(gpu, "mm", mm)
    monkeypatch.setattr(gpu, "matmul_plans", {})
    return mm


def training(gpu):
    tinynn.manual_seed(0)
    model = GPT(CFG).to(gpu)
    opt = AdamW(decay_groups(list(model.named_parameters()), 0.1), lr=1e-3, max_grad_norm=1.0)
    step = TrainStep(model, opt, 4, CFG.block_size)
    data = np.random.default_rng(0)

    def run():
        seq = (data.integers(0, CFG.vocab_size, (4, 1)) + np.arange(CFG.block_size + 1)) % CFG.vocab_size
        return step(seq[:, :-1], seq[:, 1:], 1e-3).item()
    return step, run


def test_the_first_step_runs_before_tuning_and_the_tuned_kernels_run_after(gpu, setting, tmp_path, monkeypatch,
                                                                            capsys):
    setting("TINYNN_CACHE_DIR", str(tmp_path))
    cache = tmp_path / "matmul-autotune.json"
    mm = selector(gpu, monkeypatch, autotune=True)
    mm.tune_seconds_per_step = 0.0  # one piece of tuning per step: a step never waits for a whole shape
    real_timing = getattr(MatmulSelector, "_timing", None)
    timed = []

    def timing(self, runs, reps, rounds):  # the real tuning, but the variant no default is wins
        times = yield from real_timing(self, runs, reps, rounds)
        timed.append(list(times))
        return {**times, list(times)[-1]: 0.0}
    monkeypatch.setattr(MatmulSelector, "_timing", timing, raising=False)

    step, run = training(gpu)
    losses = [run()]
    assert not cache.exists() and not timed, "tuning ran before the first step"
    assert len(mm.pending) >= 8  # every linear layer's shapes, forward and backward, are waiting
    assert "tuning" not in capsys.readouterr().err
    recaptures = gpu.counters["recaptures"]

    while mm.pending and len(losses) < 300:
        losses.append(run())
        if len(losses) == 2:
            assert "tuning kernels" in capsys.readouterr().err  # whenever it runs, a line says so
    assert not mm.pending and mm.generation == 1
    assert "shape(s) in" in capsys.readouterr().err
    tuned_at = len(losses)
    # one piece a step: each candidate's first run (its compile), then the timing of them all, shape after shape
    assert tuned_at - 1 == sum(len(names) + 1 for names in timed)
    for _ in range(6):  # eager warm-up with the tuned plans, the capture, replays
        losses.append(run())
    # the step was captured on the defaults while tuning ran, and once again, all tuned choices in
    assert gpu.counters["recaptures"] == recaptures + 1 and step._run.tape is not None
    labels = {event[1].label for event in step._run.tape.events if event[0] == "dispatch"}
    assert any(label.startswith(f"matmul {TUNED.removeprefix('blocked ')} ") for label in labels), labels
    assert any(label.startswith("matmul pair ") for label in labels), labels  # a layer's two gradients in one
    chosen = json.loads(cache.read_text())["choices"][mm.cache_key]
    assert len(chosen) == len(timed) and set(chosen.values()) <= {TUNED, *mm.pair_candidates}

    mm = selector(gpu, monkeypatch, autotune=False)  # the same run on the default kernels alone
    _, run = training(gpu)
    untuned = [run() for _ in losses]
    assert not mm.pending
    np.testing.assert_allclose(losses, untuned, rtol=1e-5)
    assert tuned_at > 3  # the comparison covers steps before and after the switch


def test_tuning_outside_a_training_loop_says_so(gpu, setting, tmp_path, monkeypatch, capsys, rng):
    setting("TINYNN_CACHE_DIR", str(tmp_path))
    mm = selector(gpu, monkeypatch, autotune=True)
    a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((24, 33)).astype(np.float32)
    got = gpu.to_numpy(gpu.matmul(gpu.from_numpy(a), gpu.from_numpy(b)))
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
    assert "tuning kernels" in capsys.readouterr().err
    assert not mm.pending and len(mm.choices) == 1


def test_one_off_shapes_are_neither_tuned_nor_kept(gpu, setting, tmp_path, monkeypatch, capsys, rng):
    """Inside `transient` a shape first seen runs its default, nothing timed, queued or kept among the choices;
    asked again outside, the same shape is tuned as ever."""
    setting("TINYNN_CACHE_DIR", str(tmp_path))
    mm = selector(gpu, monkeypatch, autotune=True)
    a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((24, 33)).astype(np.float32)
    for defer in (False, True):
        mm.defer = defer
        with gpu.transient():
            got = gpu.to_numpy(gpu.matmul(gpu.from_numpy(a), gpu.from_numpy(b)))
        np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
        assert "tuning kernels" not in capsys.readouterr().err and not mm.pending and not mm.choices
    mm.defer = False
    monkeypatch.setattr(gpu, "matmul_plans", {})  # the backend's plans made inside go: the selector is asked again
    gpu.matmul(gpu.from_numpy(a), gpu.from_numpy(b))
    assert "tuning kernels" in capsys.readouterr().err and len(mm.choices) == 1


@pytest.mark.parametrize("use_cache", [True, False])
def test_generation_tunes_no_shape_of_its_prompt_or_growing_window(gpu, setting, tmp_path, monkeypatch, capsys,
                                                                 use_cache):
    """A generator's prompt and its window growing a token at a time are one-off shapes: tuned, each would cost
    about a second (the GPU heated first) and come back only for that prompt length or token."""
    setting("TINYNN_CACHE_DIR", str(tmp_path))
    mm = selector(gpu, monkeypatch, autotune=True)
    tinynn.manual_seed(0)
    model = GPT(CFG).to(gpu)
    model.generate(np.zeros((2, 10), np.int64), 4, seed=1, use_cache=use_cache)  # 20 rows and more: no decoding kernel
    assert "tuning kernels" not in capsys.readouterr().err and not mm.pending and not mm.choices


def test_a_failed_tuning_raises_in_its_step_and_the_shape_keeps_its_default(gpu, setting, tmp_path, monkeypatch):
    setting("TINYNN_CACHE_DIR", str(tmp_path))
    mm = selector(gpu, monkeypatch, autotune=True)
    mm.tune_seconds_per_step = 0.0

    def timing(self, runs, reps, rounds):  # a candidate that fails to compile, after one that compiled
        yield
        raise RuntimeError("a candidate failed to compile")
    monkeypatch.setattr(MatmulSelector, "_timing", timing)
    _, run = training(gpu)
    run()
    key, waiting, default = next(iter(mm.pending)), len(mm.pending), dict(mm.choices)
    run()
    with pytest.raises(RuntimeError, match="failed to compile"):
        run()
    assert key not in mm.pending and len(mm.pending) == waiting - 1 and mm.choices == default
    run()  # the next shape's tuning goes on
    assert len(mm.pending) == waiting - 1 and mm.running is not None
