"""Core's settings from the environment."""
from tinynn import registry
from tinynn.settings import Settings


def test_settings_read_the_environment_and_keep_defaults_for_what_is_unset():
    assert Settings.from_environment({}) == Settings(device="auto")
    assert Settings.from_environment({"TINYNN_DEVICE": ""}).device == "auto"
    assert Settings.from_environment({"TINYNN_DEVICE": "CPU", "OTHER": "x"}).device == "CPU"


def test_a_run_that_names_no_device_takes_the_environments(monkeypatch):
    monkeypatch.setenv("TINYNN_DEVICE", "Cpu")  # names are not case-sensitive, as the flag's
    assert Settings.from_environment().device == "Cpu"
    assert registry.select(None).name == "cpu"
