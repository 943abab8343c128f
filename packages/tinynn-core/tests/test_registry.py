"""The registry: backend discovery and selection, with hand-built entry points (no package needs installing)."""
from importlib.metadata import EntryPoint

import numpy as np
import pytest

import tinynn
from tinynn import registry
from tinynn.errors import TinynnError


@pytest.fixture
def plugins(monkeypatch):
    """Install the given fake entry points in place of the real ones, for one test."""
    def install(**targets):
        registry.reset_discovery()
        eps = {name: EntryPoint(name, f"fake_backends:{target}", registry.ENTRY_POINT_GROUP)
               for name, target in targets.items()}
        monkeypatch.setattr(registry, "_entry_points", eps)
        monkeypatch.delenv("TINYNN_DEVICE", raising=False)
    yield install
    registry.reset_discovery()


def test_auto_uses_a_hardware_gpu(plugins):
    plugins(gpu="working")
    assert registry.select("auto").name == "fakegpu"
    assert registry.why_not_gpu() == ""


def test_auto_skips_software_adapters_but_gpu_accepts_them(plugins):
    plugins(gpu="software_only")
    assert registry.select("auto").name == "cpu"
    assert "software adapter" in registry.why_not_gpu()
    assert registry.select("gpu").is_software


def test_unavailable_backend_records_its_reason(plugins):
    plugins(gpu="no_adapter")
    assert registry.select("auto").name == "cpu"
    assert registry.why_not_gpu() == "gpu: no adapter found (fake)"
    with pytest.raises(TinynnError, match="no adapter found"):
        registry.select("gpu")


def test_a_broken_plugin_cannot_break_core(plugins):
    plugins(gpu="broken")
    assert registry.select("auto").name == "cpu"
    assert "RuntimeError: plugin bug" in registry.why_not_gpu()


def test_gpu_without_any_backend_installed_names_the_fix(plugins):
    plugins()
    with pytest.raises(TinynnError, match="pip install tinynn-gpu"):
        registry.select("gpu")


def test_environment_and_bad_device(plugins, monkeypatch):
    plugins(gpu="working")
    monkeypatch.setenv("TINYNN_DEVICE", "cpu")
    assert registry.select(None).name == "cpu"
    with pytest.raises(TinynnError, match="device must be one of"):
        registry.select("tpu")


def test_a_backend_for_another_interface_version_is_not_used(plugins):
    plugins(gpu="older_interface")
    assert registry.select("auto").name == "cpu"
    assert "implements backend interface 0" in registry.load("gpu").reason
    with pytest.raises(TinynnError, match="install matching versions"):
        registry.select("gpu")


def test_entry_points_load_once_and_lazily(plugins, monkeypatch):
    plugins(gpu="working")
    assert registry._loaded == {}  # discovery imports nothing
    first = registry.load("gpu").backend
    assert registry.load("gpu").backend is first


def test_missing_ops_fall_back_to_numpy_and_are_counted(plugins):
    plugins(gpu="working")
    gpu = registry.select("gpu")
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


def test_a_device_asked_for_in_the_environment_is_named_as_the_variable(plugins, monkeypatch):
    plugins(gpu="no_adapter")
    monkeypatch.setenv("TINYNN_DEVICE", "gpu")
    with pytest.raises(TinynnError, match=r"^TINYNN_DEVICE=gpu: no usable GPU backend \(gpu: no adapter found"):
        registry.select(None)
    with pytest.raises(TinynnError, match=r"^--device gpu: no usable GPU backend"):  # the flag wins, and is named
        registry.select("gpu")


def test_selection_gives_the_backend_or_the_reason_it_cannot_run(plugins, monkeypatch):
    """For `tinynn info`, which reports the backends either way and then fails when the device asked for
    cannot run."""
    plugins(gpu="no_adapter")
    assert registry.selection("cpu") == (registry.reference(), "")
    assert registry.selection("auto") == (registry.reference(), "")  # auto falls back: nothing was asked
    backend, reason = registry.selection("gpu")
    assert backend is None and reason == "--device gpu: no usable GPU backend (gpu: no adapter found (fake))"
    monkeypatch.setenv("TINYNN_DEVICE", "junk")
    assert registry.selection(None) == (None, "TINYNN_DEVICE must be one of auto, cpu, gpu, got 'junk'")


def refuses_its_setting():
    """A backend factory that finds the user's setting for it unusable (tinynn-gpu's TINYNN_ADAPTER_INDEX=x)."""
    raise TinynnError("TINYNN_ADAPTER_INDEX must be a whole number, got 'x'")


def test_a_backend_setting_the_user_got_wrong_is_an_error_even_for_auto(plugins, monkeypatch):
    """Not a quiet fallback to the CPU: the user set the variable to choose a GPU."""
    plugins()
    monkeypatch.setattr(registry, "_entry_points", {
        "gpu": EntryPoint("gpu", f"{__name__}:refuses_its_setting", registry.ENTRY_POINT_GROUP)})
    for device in ("auto", "gpu"):
        with pytest.raises(TinynnError, match=r"^gpu: TINYNN_ADAPTER_INDEX must be a whole number, got 'x'$"):
            registry.select(device)
    assert registry.select("cpu").name == "cpu"  # the CPU asked for never looks at a GPU
    assert [s.reason for s in registry.statuses()][1] == "TINYNN_ADAPTER_INDEX must be a whole number, got 'x'"
    assert registry.why_not_gpu() == "gpu: TINYNN_ADAPTER_INDEX must be a whole number, got 'x'"  # for info
