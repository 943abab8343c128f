"""The GPU backend as core uses it: selection, fallback to the CPU, training on the GPU against the CPU,
host syncs per step, caching, and inputs larger than a storage binding."""
import os

import numpy as np
import pytest

import tinynn
from tinynn import backends, registry
from tinynn.backends import BackendUnavailable
from tinynn.errors import TinynnError
from tinynn.model import GPT, GPTConfig
from tinynn.optim import AdamW, decay_groups
from tinynn.train import TrainStep
from tinynn_gpu import create_backend
from tinynn_gpu.runtime.webgpu import wgpu

CFG = GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=32)


def test_entry_point_is_registered_and_lazy():
    assert "gpu" in registry.discovered()
    assert registry.discovered()["gpu"].value == "tinynn_gpu:create_backend"


def test_gpu_backend_describes_its_adapter(gpu):
    info = gpu.describe()
    assert info["backend"] == "gpu" and info["adapter"] and info["graphics_backend"]
    assert info["max_storage_binding_bytes"] >= 128 * 2**20  # the adapter's limit, not WebGPU's default cap


def test_no_adapter_means_cpu_with_the_reason(monkeypatch):
    monkeypatch.setattr(wgpu.gpu, "enumerate_adapters_sync", lambda: [])
    with pytest.raises(BackendUnavailable, match="no WebGPU adapter found"):
        create_backend()
    registry.reset_discovery()
    try:
        assert registry.select("auto").name == "cpu"
        assert "no WebGPU adapter found" in registry.why_not_gpu()
        with pytest.raises(tinynn.TinynnError, match="no WebGPU adapter found"):
            registry.select("gpu")
        losses = train_losses(registry.select("auto"), steps=3)
        assert losses == train_losses(backends.reference(), steps=3)  # the same backend, identical numbers
    finally:
        registry.reset_discovery()


def test_a_template_kernel_that_fails_to_compile_is_a_start_up_reason(gpu, monkeypatch):
    """The kernels compiled from templates (group_sum's) are compiled when the backend starts, so a driver
    that refuses one leaves a reason there, not an exception in the middle of the first training step."""
    from tinynn_gpu import backend
    from tinynn_gpu.ops import group_sum
    plain = group_sum.kernel_source
    monkeypatch.setattr(group_sum, "kernel_source",
                        lambda name, fills=None: "fn broken( {" if name == "layernorm" else plain(name, fills))
    with pytest.raises(BackendUnavailable, match="kernel layernorm.wgsl failed to compile"):
        backend.WgpuBackend(gpu.ctx)


def test_adapter_choice_by_name(setting, monkeypatch):
    setting("TINYNN_ADAPTER", "no-such-gpu")  # the user's setting: an error, not a reason to run on the CPU
    with pytest.raises(TinynnError, match="^TINYNN_ADAPTER='no-such-gpu' matches no adapter"):
        create_backend()


@pytest.mark.parametrize("index, error", [("x", True), ("-1", True), ("", False), (" 0 ", False), ("7", False)])
def test_adapter_index_is_a_whole_number_or_unset(setting, index, error):
    from tinynn_gpu.runtime.context import choose_adapter

    class Adapter:
        info = {"device": "one", "adapter_type": "DiscreteGPU", "backend_type": "Vulkan"}
    setting("TINYNN_ADAPTER_INDEX", index)
    adapters = [Adapter(), Adapter()]
    if error:
        with pytest.raises(TinynnError, match=f"^TINYNN_ADAPTER_INDEX must be a whole number, got '{index}'$"):
            choose_adapter(adapters)
    else:
        assert choose_adapter(adapters) is adapters[int(index.strip() or 0) % 2]


def test_software_adapter_is_not_used_by_auto(gpu):
    if not gpu.is_software:
        pytest.skip("a hardware adapter is present")
    assert registry.select("auto").name == "cpu"
    assert "software adapter" in registry.why_not_gpu()


def train_losses(backend, steps, seed=0):
    tinynn.manual_seed(seed)
    model = GPT(CFG).to(backend)
    opt = AdamW(decay_groups(list(model.named_parameters()), 0.1), lr=3e-3, max_grad_norm=1.0)
    data = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):  # counting sequences from random starts: learnable, so the curve moves
        seq = (data.integers(0, CFG.vocab_size, (4, 1)) + np.arange(CFG.block_size + 1)) % CFG.vocab_size
        _, loss = model(seq[:, :-1], seq[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_training_matches_the_cpu_step_by_step(gpu):
    """Same seed, same data: the GPU's loss curve follows the CPU's within 1e-3 relative for 50 steps."""
    cpu_losses, gpu_losses = train_losses(backends.reference(), 50), train_losses(gpu, 50)
    rel = np.abs(np.array(gpu_losses) - cpu_losses) / np.abs(cpu_losses)
    assert rel.max() <= 1e-3, f"max relative difference {rel.max():.2e} at step {rel.argmax()}"
    assert gpu_losses[-1] < gpu_losses[0] - 0.3  # and it learns


def test_one_host_sync_per_step_and_cached_bind_groups(gpu):
    tinynn.manual_seed(0)
    model = GPT(CFG).to(gpu)
    opt = AdamW(model.parameters(), lr=1e-3, max_grad_norm=1.0)
    x = np.random.default_rng(0).integers(0, CFG.vocab_size, (4, CFG.block_size))

    def step():
        _, loss = model(x, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    for _ in range(12):  # warm up: pipelines, buffers and bind groups settle within ~8 steps
        step()
    before, fallbacks = dict(gpu.counters), dict(gpu.fallbacks)  # the session's backend: earlier tests' counts
    for _ in range(3):
        step()
    delta = {k: gpu.counters[k] - before.get(k, 0) for k in gpu.counters}
    assert delta["host_syncs"] == 3
    assert delta.get("bind_groups_created", 0) == 0
    assert dict(gpu.fallbacks) == fallbacks


def test_an_eval_forward_allocates_no_backward_only_outputs(gpu, monkeypatch):
    """Under no_grad, LayerNorm's mean and rstd, the MLP's GELU input and attention's lse go to the runtime's
    scratch arrays, and the fused classifier makes no gradients: a forward allocates that many arrays fewer."""
    tinynn.manual_seed(0)
    model = GPT(CFG).to(gpu)
    x = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, CFG.block_size))
    made, empty = [], type(gpu.rt).empty

    def counted(rt, shape, dtype=np.float32):
        made.append(shape)
        return empty(rt, shape, dtype)
    monkeypatch.setattr(type(gpu.rt), "empty", counted)
    monkeypatch.setattr(gpu, "_empty", gpu.rt.empty)  # the backend's own reference, bound before the patch

    def arrays_made():
        made.clear()
        model(x, x)[1].item()
        return len(made)
    model.eval()
    with tinynn.no_grad():
        arrays_made()  # the scratch arrays, made once
        without = arrays_made()
    arrays_made()  # the head's backward planned, once
    with_grad = arrays_made()
    layer_norms = 2 * CFG.n_layer + 1
    # + GELU inputs and lse, + the head's three gradients (the fused classifier makes them in the forward)
    assert with_grad - without == 2 * layer_norms + 2 * CFG.n_layer + 3


def test_arrays_beyond_the_binding_limit_run_on_the_cpu(gpu, monkeypatch, rng):
    monkeypatch.setattr(gpu.rt, "max_binding", 4096)  # pretend the device binds at most 1024 floats
    a, b = rng.standard_normal((40, 50)).astype(np.float32), rng.standard_normal((50, 30)).astype(np.float32)
    da, db = gpu.from_numpy(a), gpu.from_numpy(b)
    assert da.buffer is None  # 8000 bytes: kept on the host
    got = gpu.to_numpy(gpu.matmul(da, db))
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
    assert gpu.fallbacks["matmul"] >= 1
    small = gpu.from_numpy(a[:4])
    np.testing.assert_allclose(gpu.to_numpy(gpu.unary("relu", small)), np.maximum(a[:4], 0))


def test_demo_4_on_the_gpu(gpu, capsys):
    from tinynn import demo
    registry.set_default(gpu)
    try:
        result = demo.demo_gpu(size=128)  # lavapipe emulates the GPU on the CPU: keep it small
    finally:
        registry.reset_discovery()
    assert result["max_abs_error"] < 1e-4 and result["elementwise_ok"]
    assert "128x128 matmul" in capsys.readouterr().out


def test_cli_trains_on_the_gpu(gpu, tmp_path, monkeypatch, capsys):
    from tinynn.cli import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.txt").write_text("abcabcabd " * 200)
    (tmp_path / "c.json").write_text('{"data": "d.txt", "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16,'
                                     ' "batch_size": 4, "max_steps": 5, "eval_interval": 5, "eval_steps": 1,'
                                     ' "sample_tokens": 10, "out_dir": "o"}')
    assert main(["train", "--config", "c.json", "--device", "gpu", "--quiet"]) == 0
    assert "sample:" in capsys.readouterr().out
    registry.reset_discovery()


def captured_losses(backend, steps, dropout=0.0, seed=0):
    tinynn.manual_seed(seed)
    model = GPT(GPTConfig(**{**CFG.__dict__, "dropout": dropout})).to(backend)
    opt = AdamW(decay_groups(list(model.named_parameters()), 0.1), lr=3e-3, max_grad_norm=1.0)
    step = TrainStep(model, opt, 4, CFG.block_size)
    data = np.random.default_rng(seed)
    losses = []
    for i in range(steps):
        seq = (data.integers(0, CFG.vocab_size, (4, 1)) + np.arange(CFG.block_size + 1)) % CFG.vocab_size
        losses.append(step(seq[:, :-1], seq[:, 1:], 3e-3 * (1 - i / steps)).item())
    return losses, step


def test_a_model_whose_mlp_exceeds_the_binding_limit_trains_as_the_cpu_does(gpu, monkeypatch):
    """The MLP's weights (16 KiB) and activations live on the host: their ops run the counted reference, the
    backward's fused GELU gradient included (its input passed by keyword), and the losses are NumPy's."""
    monkeypatch.setattr(gpu.rt, "max_binding", 16000)
    before = gpu.fallbacks["linear_backward"]
    ours, _ = captured_losses(gpu, 3)
    assert gpu.fallbacks["linear_backward"] > before
    monkeypatch.undo()
    np.testing.assert_allclose(ours, captured_losses(backends.reference(), 3)[0], rtol=1e-4)


def test_captured_step_replays_exactly_what_eager_computes(gpu, monkeypatch):
    replayed, step = captured_losses(gpu, 12)
    assert step._run.tape is not None and step._run.eager_reason is None
    assert len(step._run.tape.events) > 50  # a whole 2-layer step: forward, backward, optimizer
    replays = gpu.counters["replays"]
    # the same run uncaptured: the same kernels, same order
    monkeypatch.setattr(gpu, "capture", lambda fn, key=None: fn)
    eager, _ = captured_losses(gpu, 12)
    monkeypatch.undo()
    assert replayed == eager
    assert gpu.counters["replays"] == replays
    cpu, _ = captured_losses(backends.reference(), 12)
    np.testing.assert_allclose(replayed, cpu, rtol=1e-3)


def test_replayed_steps_sync_once_and_skip_python(gpu):
    _, step = captured_losses(gpu, 6)
    before = dict(gpu.counters)
    x = np.zeros((4, CFG.block_size), np.int64)
    for _ in range(3):
        step(x, x, 1e-3).item()
    assert gpu.counters["host_syncs"] - before["host_syncs"] == 3
    assert gpu.counters["replays"] - before.get("replays", 0) == 3
    assert gpu.counters.get("bind_groups_created", 0) == before.get("bind_groups_created", 0)
    program, _ = step._run.tape.programs[gpu.rt.native is not None]
    buffers = sum(kind == "dispatches" for kind, _ in program)  # a command buffer for each run between writes
    assert buffers == 2  # no write inside the step: the forward's, up to the loss's last use, and the rest
    # the loss's read-back submits nothing where the step's own command buffer copied it out (the direct calls)
    read_backs = 0 if gpu.rt.native is not None else 1
    assert gpu.counters["submissions"] - before["submissions"] == 3 * (buffers + read_backs)
    # the step's inputs (tokens, targets, the optimizer's values): staged, one queue write, copied in by the
    # step's first command buffer
    assert gpu.counters["queue_writes"] - before["queue_writes"] == 3


def test_dropout_keeps_the_step_eager(gpu):
    _, step = captured_losses(gpu, 5, dropout=0.1)
    assert step._run.tape is None and "dropout" in step._run.eager_reason


def test_a_constant_uploaded_inside_the_step_is_replayed(gpu):
    w = tinynn.tensor(np.zeros(4), backend=gpu)
    step = gpu.capture(lambda: (w * tinynn.tensor(np.full(4, 2.0), backend=gpu)).sum())
    for value in range(1, 8):  # the first calls run eagerly, then one is captured, then it is replayed
        gpu.write_(w.data, np.full(4, float(value), np.float32))
        assert step().item() == 8.0 * value
    assert step.tape is not None and any(event[0] == "write" for event in step.tape.events)


@pytest.mark.parametrize("name", ["sgd_update_", "adamw_update_"])
def test_an_update_with_one_array_too_large_to_bind_steps_every_parameter_once(gpu, monkeypatch, name, rng):
    """The whole update falls back to the CPU, decided before any parameter is updated on the GPU."""
    monkeypatch.setattr(gpu.rt, "max_binding", 4096)
    shapes = [(10,), (40, 50), (3,)]  # the middle one (8000 bytes) lives on the host
    p, g, m, v = ([rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(4))
    v = [np.abs(x) for x in v]
    if name == "sgd_update_":
        arrays, hyper, kwargs = (p, g, m), [0.1], dict(momentum=0.9, weight_decay=0.01)
    else:
        arrays, hyper = (p, g, m, v), [0.01, 0.1, 0.01]
        kwargs = dict(beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
    hyper = np.asarray(hyper, np.float32)
    ours = [[gpu.from_numpy(x) for x in group] for group in arrays]
    assert ours[0][1].buffer is None and ours[0][0].buffer is not None
    getattr(gpu, name)(*ours, gpu.from_numpy(hyper), **kwargs)
    ref = [[x.copy() for x in group] for group in arrays]
    getattr(backends.reference(), name)(*ref, hyper, **kwargs)
    for got, want in zip(ours[0], ref[0]):
        np.testing.assert_allclose(gpu.to_numpy(got), want, rtol=1e-5, atol=1e-6)
    assert gpu.fallbacks[name] >= 1


def test_int32_ops_without_a_kernel_are_counted_fallbacks(gpu):
    t = tinynn.tensor([5, 6, 7], backend=gpu)
    before = dict(gpu.fallbacks)
    assert t.sum().numpy() == 18 and (t * t).numpy().tolist() == [25, 36, 49]
    assert gpu.fallbacks["sum"] == before.get("sum", 0) + 1  # sum and max of int32 run on NumPy
    assert gpu.fallbacks["binary"] == before.get("binary", 0)  # int32 multiply has its kernel


FLOAT_ENTRIES = {"unary_main": ("a",), "unary_backward_main": ("a", "b", "c"), "binary_main": ("a", "b"),
                 "scalar_main": ("a",)}
INT_ENTRIES = {"unary_int_main": ("a_int",), "binary_int_main": ("a_int", "b_int"), "scalar_int_main": ("a_int",)}


@pytest.mark.parametrize("entry", [*FLOAT_ENTRIES, *INT_ENTRIES])
def test_an_unknown_op_code_computes_no_other_op(gpu, entry):
    """backend.py refuses unknown ops first; a kernel given one anyway writes NaN (int32: its lowest value)."""
    rt, is_int = gpu.rt, entry in INT_ENTRIES
    dtype = np.int32 if is_int else np.float32
    x, out = rt.upload(np.ones(8, dtype)), rt.empty((8,), dtype)
    bindings = {slot: x for slot in (INT_ENTRIES if is_int else FLOAT_ENTRIES)[entry]}
    bindings["out_int" if is_int else "out"] = out
    rt.dispatch("elementwise", entry, 1, bindings, {"n": 8, "op": 99, "ndim": 1, "shape": [8], "a_strides": [1],
                                                    "b_strides": [1]})
    got = rt.read(out)
    assert (got == -2**31).all() if is_int else np.isnan(got).all(), got


HIDE_WGPU = """
import sys
class HideWgpu:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "wgpu":
            raise ImportError("hidden by the test")
sys.meta_path.insert(0, HideWgpu())
from tinynn import registry
print(registry.load("gpu").reason)
"""


def test_missing_wgpu_is_the_reason_given():
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TINYNN_WEBGPU"}  # the default implementation, wgpu-native
    run = subprocess.run([sys.executable, "-c", HIDE_WGPU], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "wgpu is not importable (hidden by the test)"


def test_an_id_out_of_range_in_a_replayed_step_raises_at_its_read(gpu):
    from tinynn.errors import TinynnError
    _, step = captured_losses(gpu, 6)
    assert step._run.tape is not None
    x = np.zeros((4, CFG.block_size), np.int64)
    bad = x.copy()
    bad[1, 3] = CFG.vocab_size  # one past the vocabulary
    with pytest.raises(TinynnError, match="embedding: an id is outside"):
        step(bad, x, 1e-3).item()
    assert np.isfinite(step(x, x, 1e-3).item())  # raised once; the next step reads cleanly
