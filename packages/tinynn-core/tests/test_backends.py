"""Backend discovery and selection, with hand-built entry points (no package needs installing)."""
from importlib.metadata import EntryPoint

import numpy as np
import pytest

import tinynn
from tinynn import backends
from tinynn.errors import TinynnError


@pytest.fixture
def plugins(monkeypatch):
    """Install the given fake entry points in place of the real ones, for one test."""
    def install(**targets):
        backends.reset_discovery()
        eps = {name: EntryPoint(name, f"fake_backends:{target}", backends.ENTRY_POINT_GROUP)
               for name, target in targets.items()}
        monkeypatch.setattr(backends, "_entry_points", eps)
        monkeypatch.delenv("TINYNN_DEVICE", raising=False)
    yield install
    backends.reset_discovery()


def test_auto_uses_a_hardware_gpu(plugins):
    plugins(gpu="working")
    assert backends.select("auto").name == "fakegpu"
    assert backends.why_not_gpu() == ""


def test_auto_skips_software_adapters_but_gpu_accepts_them(plugins):
    plugins(gpu="software_only")
    assert backends.select("auto").name == "cpu"
    assert "software adapter" in backends.why_not_gpu()
    assert backends.select("gpu").is_software


def test_unavailable_backend_records_its_reason(plugins):
    plugins(gpu="no_adapter")
    assert backends.select("auto").name == "cpu"
    assert backends.why_not_gpu() == "gpu: no adapter found (fake)"
    with pytest.raises(TinynnError, match="no adapter found"):
        backends.select("gpu")


def test_a_broken_plugin_cannot_break_core(plugins):
    plugins(gpu="broken")
    assert backends.select("auto").name == "cpu"
    assert "RuntimeError: plugin bug" in backends.why_not_gpu()


def test_gpu_without_any_backend_installed_names_the_fix(plugins):
    plugins()
    with pytest.raises(TinynnError, match="pip install tinynn-gpu"):
        backends.select("gpu")


def test_environment_and_bad_device(plugins, monkeypatch):
    plugins(gpu="working")
    monkeypatch.setenv("TINYNN_DEVICE", "cpu")
    assert backends.select(None).name == "cpu"
    with pytest.raises(TinynnError, match="device must be one of"):
        backends.select("tpu")


def test_a_backend_for_another_interface_version_is_not_used(plugins):
    plugins(gpu="older_interface")
    assert backends.select("auto").name == "cpu"
    assert "implements backend interface 0" in backends.load("gpu").reason
    with pytest.raises(TinynnError, match="install matching versions"):
        backends.select("gpu")


def test_entry_points_load_once_and_lazily(plugins, monkeypatch):
    plugins(gpu="working")
    assert backends._loaded == {}  # discovery imports nothing
    first = backends.load("gpu").backend
    assert backends.load("gpu").backend is first


def test_missing_ops_fall_back_to_numpy_and_are_counted(plugins):
    plugins(gpu="working")
    gpu = backends.select("gpu")
    a = tinynn.tensor(np.eye(3), backend=gpu)
    b = tinynn.tensor(np.arange(9.0).reshape(3, 3), backend=gpu)
    np.testing.assert_array_equal((a @ b).numpy(), np.arange(9.0).reshape(3, 3))
    assert gpu.fallbacks["matmul"] == 1


def test_tensors_on_different_backends_do_not_mix(plugins):
    plugins(gpu="working")
    a = tinynn.tensor([1.0], backend="cpu")
    b = tinynn.tensor([1.0], backend="gpu")
    with pytest.raises(ValueError, match="different backends"):
        a + b


def test_every_op_has_a_reference_with_the_interface_signature():
    """The NumPy backend implements every op itself (its fallback would call itself), with the parameter
    names the interface documents, so a backend written from the interface fits the reference."""
    import inspect
    ops = backends.Backend.ops()
    assert {"matmul", "layernorm_backward", "adamw_update_"} <= set(ops)
    for name in ops:
        ref = getattr(type(backends.reference()), name)
        assert not getattr(ref, "is_op", False), f"the NumPy backend lacks its own {name}"
        declared = inspect.signature(getattr(backends.Backend, name))
        assert list(inspect.signature(ref).parameters) == list(declared.parameters), name


def test_an_inplace_fallback_writes_the_reference_results_back():
    from fake_backends import FakeGpu

    class NoSgd(FakeGpu):
        sgd_update_ = backends.Backend.sgd_update_
    gpu = NoSgd()
    p, g, buf = (gpu.from_numpy(np.full(3, v)) for v in (1.0, 0.5, 0.0))
    gpu.sgd_update_([p], [g], [buf], gpu.from_numpy(np.array([0.1])), momentum=0.0, weight_decay=0.0)
    np.testing.assert_allclose(gpu.to_numpy(p), np.full(3, 0.95))
    assert gpu.fallbacks["sgd_update_"] == 1
