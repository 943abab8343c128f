"""Core's settings from the environment."""
import pytest

from tinynn import registry
from tinynn.errors import TinynnError
from tinynn.settings import Settings


def test_settings_read_the_environment_and_keep_defaults_for_what_is_unset():
    assert Settings.from_environment({}) == Settings(device="auto")
    assert Settings.from_environment({"TINYNN_DEVICE": ""}).device == "auto"
    assert Settings.from_environment({"TINYNN_DEVICE": " CPU ", "OTHER": "x"}).device == "cpu"


def test_a_run_that_names_no_device_takes_the_environments(monkeypatch):
    monkeypatch.setenv("TINYNN_DEVICE", "Cpu")  # names are not case-sensitive, as the flag's
    assert Settings.from_environment().device == "cpu"
    assert registry.select(None).name == "cpu"


@pytest.mark.parametrize("value", ["junk", "cuda", "gpu0"])
def test_junk_in_TINYNN_DEVICE_is_named_as_the_variable(monkeypatch, value):
    with pytest.raises(TinynnError, match=f"^TINYNN_DEVICE must be one of auto, cpu, gpu, got '{value}'$"):
        Settings.from_environment({"TINYNN_DEVICE": value})
    monkeypatch.setenv("TINYNN_DEVICE", value)
    with pytest.raises(TinynnError, match="^TINYNN_DEVICE must be one of"):
        registry.select(None)
    assert registry.select("cpu").name == "cpu"  # a device named by the caller never reads the variable
