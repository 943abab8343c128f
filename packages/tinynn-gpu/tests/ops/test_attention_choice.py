"""In matmul precision "high", the choice per shape between the tensor-core attention kernels and the float32 ones
(ops/attention_choice.py), the forward and the backward each on its own, through the matmuls' autotuning: the
faster of the two runs and is kept in the tuning cache, the choice waits for the moments between a captured
step's calls, float32 runs without autotuning, and float32 runs whatever the timing where the tensor-core kernels
fail their first-use check. The tensor-core kernels are the emulated ones (test_attention_tensor.py), so all of
it runs on lavapipe; the selector's timing function is injected: each kernel call costs what the test says."""
import json

import numpy as np
import pytest

from test_attention_tensor import SMALL_TILES, check_backward, check_forward, gradient_terms, make_qkv, run_attention
from tinynn import backends, precision
from tinynn.errors import TinynnNotice
from tinynn.tensor import Tensor
from tinynn_gpu.matmul.selection import MatmulSelector
from tinynn_gpu.ops import attention_tensor, attention_tensor_backward
from tinynn_gpu.ops.attention_choice import FLOAT32, TENSOR, AttentionChoice, key
from tinynn_gpu.ops.attention_tensor import TensorAttention
from tinynn_gpu.ops.attention_tensor_backward import TensorBackward

CASE = (1, 20, 2, 64, (1, 1, 1))  # head size 64, the first-use check's own: no kernel compiles beyond the check's
SHAPE = (CASE[0], CASE[1], 3 * CASE[2] * CASE[3])  # qkv's
KERNELS = [(d, p) for d in ("forward", "backward") for p in (TENSOR, FLOAT32)]


class Clock:
    """Counts the attention kernels' calls, each (direction, path) costing `costs`' milliseconds of a clock that
    the selector's timing function (`_time`) reads instead of the GPU's."""

    def __init__(self, gpu, monkeypatch):
        self.now, self.calls, self.timings, self.costs = 0.0, [], 0, {}
        att = gpu.attention
        for (direction, path), (owner, name) in zip(KERNELS, [(att.tensor, "forward"), (att, "_forward_float32"),
                                                              (att.tensor_backward, "backward"),
                                                              (att, "_backward_float32")]):
            monkeypatch.setattr(owner, name, self.counted(getattr(owner, name), (direction, path)))
        monkeypatch.setattr(MatmulSelector, "_time", lambda selector, run, reps: self.time(run))

    def counted(self, kernel, label):
        def run(*args):
            self.calls.append(label)
            self.now += self.costs.get(label, 1.0)
            return kernel(*args)
        return run

    def time(self, run) -> float:
        self.timings += 1
        start = self.now
        run()
        return self.now - start

    def winners(self, forward: str, backward: str) -> None:
        """Costs under which `forward` and `backward` are each the faster path."""
        self.costs = {(d, p): 1.0 if p == winner else 2.0 for d, p in KERNELS
                      for winner in [forward if d == "forward" else backward]}


@pytest.fixture
def high_tuned(poisoned, setting, tmp_path, monkeypatch):
    """"high" attention on the emulated tensor-core kernels (not yet checked) with a fresh selector that tunes
    every shape, its cache under tmp_path, as on a device with tensor cores (no matmul runs in these tests); and
    the Clock counting the kernels' calls. Returns (gpu, clock, a function making another such selector)."""
    gpu = poisoned
    setting("TINYNN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(attention_tensor, "TENSOR_TILES", SMALL_TILES[0])
    monkeypatch.setattr(attention_tensor_backward, "BACKWARD_TENSOR_TILES", SMALL_TILES[1])
    monkeypatch.setattr(gpu.attention, "tensor", TensorAttention(gpu.rt, emulate=True))
    monkeypatch.setattr(gpu.attention, "tensor_backward", TensorBackward(gpu.rt, emulate=True))
    monkeypatch.setattr(gpu.attention, "checked", {})

    def selector(autotune=True):
        """The backend's selector and attention choice replaced by fresh ones (autotune None: the setting's)."""
        mm = MatmulSelector(gpu.rt, autotune=autotune)
        mm.tune_min_macs = 0
        mm._tensor_cores = (True, "")
        monkeypatch.setattr(gpu, "mm", mm)
        monkeypatch.setattr(gpu.attention, "choice", AttentionChoice(mm))
        return mm
    selector()
    clock = Clock(gpu, monkeypatch)
    precision.set_matmul_precision("high")
    yield gpu, clock, selector
    precision.set_matmul_precision(None)


def check_results(gpu, results, qkv, label):
    y, lse, g_qkv = results
    n_head, head_size = CASE[2], CASE[3]
    grad = np.random.default_rng(1).standard_normal((CASE[0], CASE[1], n_head * head_size))  # run_attention's
    y_ref, lse_ref = check_forward(y, lse, qkv, n_head, label)
    g_ref = backends.reference().attention_backward(grad, qkv.astype(np.float64), y_ref, lse_ref, n_head,
                                                    head_size ** -0.5)
    check_backward(g_qkv, g_ref, gradient_terms(qkv, grad, lse_ref, n_head), label)


@pytest.mark.parametrize("forward, backward", [(TENSOR, FLOAT32), (FLOAT32, TENSOR), (FLOAT32, FLOAT32)],
                         ids=["tensor-forward-faster", "tensor-backward-faster", "tensor-slower"])
def test_the_faster_kernels_run_and_are_kept(high_tuned, tmp_path, forward, backward):
    """Both paths of each direction are timed on the shape's first call, the faster of each runs (a slower
    tensor-core path never does), the choices go to the tuning cache, and a new selector reads them back and
    runs them untimed."""
    gpu, clock, selector = high_tuned
    assert gpu.attention.tensor_cores(64)
    clock.winners(forward, backward)
    clock.calls.clear()
    results, qkv = run_attention(gpu, CASE)
    assert set(clock.calls) == set(KERNELS) and clock.timings == 8  # 2 rounds of 2 paths, each direction
    check_results(gpu, results, qkv, f"{forward} forward, {backward} backward")
    clock.calls.clear()
    run_attention(gpu, CASE)
    assert clock.calls == [("forward", forward), ("backward", backward)]
    shown = gpu.describe()["attention"]
    assert f"forward B1 T20 nh2 hs64: {forward} (timed); backward B1 T20 nh2 hs64: {backward} (timed)" in shown

    cached = json.loads((tmp_path / "matmul-autotune.json").read_text())["choices"][gpu.mm.cache_key]
    assert cached == {key("forward", SHAPE, 2): forward, key("backward", SHAPE, 2): backward}
    selector()
    clock.calls.clear()
    clock.timings = 0
    results, qkv = run_attention(gpu, CASE)
    assert clock.calls == [("forward", forward), ("backward", backward)] and clock.timings == 0
    check_results(gpu, results, qkv, f"{forward} forward, {backward} backward from the cache")


@pytest.mark.parametrize("why", ["TINYNN_AUTOTUNE=0", "too small to time"])
def test_untimed_attention_runs_float32(high_tuned, setting, why):
    """Without autotuning (even over a cache naming the tensor-core kernels) or on a shape too small to time,
    "high" attention runs the float32 kernels, untimed, and `tinynn info` says so."""
    gpu, clock, selector = high_tuned
    clock.winners(TENSOR, TENSOR)
    if why == "TINYNN_AUTOTUNE=0":
        setting("TINYNN_AUTOTUNE", "0")
        mm = selector(autotune=None)
        for direction in ("forward", "backward"):
            mm.cache.keep(key(direction, SHAPE, 2), TENSOR)
        mm = selector(autotune=None)
        assert not mm.autotune
    else:
        gpu.mm.tune_min_macs = MatmulSelector.tune_min_macs
    assert gpu.attention.tensor_cores(64)
    clock.calls.clear()
    results, qkv = run_attention(gpu, CASE)
    assert clock.calls == [("forward", FLOAT32), ("backward", FLOAT32)] and clock.timings == 0
    check_results(gpu, results, qkv, f"float32, {why}")
    shown = gpu.describe()["attention"]
    assert "forward B1 T20 nh2 hs64: float32 (untimed); backward B1 T20 nh2 hs64: float32 (untimed)" in shown
    assert shown.startswith("float32, in matmul precision 'high' too" if why == "TINYNN_AUTOTUNE=0" else
                            "in matmul precision 'high', per shape the faster"), shown


def no_backward(*args):
    """A backward that writes nothing."""


def test_a_failed_check_runs_float32_whatever_the_timing(high_tuned, monkeypatch):
    """A tensor-core backward that answers wrong fails the first-use check: both directions then run float32,
    untimed, though the clock would make the tensor-core kernels faster (the forward's answers right)."""
    gpu, clock, _ = high_tuned
    monkeypatch.setattr(gpu.attention.tensor_backward, "backward", no_backward)
    clock.winners(TENSOR, TENSOR)
    with pytest.warns(TinynnNotice, match="attention in matmul precision 'high' runs in float32"):
        assert not gpu.attention.tensor_cores(64)
    clock.calls.clear()
    results, qkv = run_attention(gpu, CASE)
    assert clock.calls == [("forward", FLOAT32), ("backward", FLOAT32)] and clock.timings == 0
    assert not gpu.mm.choices
    check_results(gpu, results, qkv, "float32 after a failed check")
    assert gpu.describe()["attention"].startswith("float32 in every precision: the tensor-core attention backward")


def test_a_captured_step_times_between_calls_and_is_recorded_again(high_tuned):
    """In a captured step the first call runs float32 and leaves the timing for the moments between calls; once
    a choice changes, the step is recorded again, and its replays run the tensor-core forward and the float32
    backward that the clock made faster, with their answers."""
    gpu, clock, _ = high_tuned
    clock.winners(TENSOR, FLOAT32)
    assert gpu.attention.tensor_cores(64)
    clock.calls.clear()
    batch, seq, n_head, head_size, _ = CASE
    qkv = make_qkv(*CASE)
    grad = np.random.default_rng(1).standard_normal((batch, seq, n_head * head_size))
    d_qkv, d_grad = gpu.from_numpy(qkv), gpu.from_numpy(grad.astype(np.float32))
    scale = head_size ** -0.5

    def step():
        y, lse = gpu.attention_forward(d_qkv, n_head, scale)
        return Tensor(gpu.attention_backward(d_grad, d_qkv, y, lse, n_head, scale), gpu)
    captured = gpu.capture(step)
    captured()
    assert clock.calls == [("forward", FLOAT32), ("backward", FLOAT32)] and clock.timings == 0
    assert len(gpu.mm.pending) == 2 and gpu.tuning_pending == 2
    assert "float32 until timed between steps" in gpu.describe()["attention"]
    for _ in range(8):
        g_qkv = gpu.to_numpy(captured().data)
    assert not gpu.mm.pending and gpu.mm.generation == 1 and clock.timings == 8
    assert captured.tape is not None, captured.eager_reason
    labels = [event[1].label for event in captured.tape.events if event[0] == "dispatch"]
    assert any(label.startswith("attention tensor hs64") for label in labels), labels
    assert not any(label.startswith("attention tensor backward") for label in labels), labels
    y_ref, lse_ref = backends.reference().attention_forward(qkv.astype(np.float64), n_head, scale)
    g_ref = backends.reference().attention_backward(grad, qkv.astype(np.float64), y_ref, lse_ref, n_head, scale)
    check_backward(g_qkv, g_ref, gradient_terms(qkv, grad, lse_ref, n_head), "replayed")
