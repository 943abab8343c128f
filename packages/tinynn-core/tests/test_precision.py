"""Matmul precision (tinynn/precision.py): the environment, set_matmul_precision and a config's key, each checked
with one line naming where a bad value came from; a training config's choice holds for its run alone."""
import json

import pytest

import tinynn
from tinynn import config, precision, registry
from tinynn.cli import main
from tinynn.errors import TinynnError
from tinynn.train import train


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv(precision.ENV, raising=False)
    precision.set_matmul_precision(None)
    yield
    precision.set_matmul_precision(None)


def test_default_environment_and_set(monkeypatch):
    assert precision.current() == "highest" and precision.chosen() is None  # the environment's again
    monkeypatch.setenv(precision.ENV, " High ")
    precision.set_matmul_precision(None)  # back to the environment's, read afresh
    assert precision.current() == "high"
    tinynn.set_matmul_precision("highest")
    assert precision.current() == "highest"


@pytest.mark.parametrize("value", ["medium", "fp16", "tf32"])
def test_bad_values_name_their_source(monkeypatch, value):
    with pytest.raises(TinynnError, match=r"^matmul precision must be one of highest, high, got"):
        tinynn.set_matmul_precision(value)
    monkeypatch.setenv(precision.ENV, value)
    precision.set_matmul_precision(None)
    with pytest.raises(TinynnError, match=rf"^{precision.ENV} must be one of highest, high, got '{value}'$"):
        precision.current()


def test_junk_in_the_environment_is_refused_on_the_cpu_too(workdir, monkeypatch, capsys):
    """The NumPy backend never plans a matmul, so nothing there read the variable: train and generate ran."""
    monkeypatch.setenv(precision.ENV, "bogus")
    precision.set_matmul_precision(None)
    with pytest.raises(TinynnError, match=rf"^{precision.ENV} must be one of highest, high, got 'bogus'$"):
        registry.select("cpu")
    (workdir / "c.json").write_text(json.dumps({"data": "data.txt", "max_steps": 1, "matmul_precision": "high"}))
    assert main(["train", "--config", "c.json", "--device", "cpu", "--quiet"]) == 2  # the config's key does not hide it
    assert capsys.readouterr().err == f"tinynn: error: {precision.ENV} must be one of highest, high, got 'bogus'\n"


def test_config_key_is_checked(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"matmul_precision": "half"}))
    with pytest.raises(TinynnError, match=r"'matmul_precision' must be one of highest, high or null, got 'half'"):
        config.load(path)


def test_the_cpu_says_it_runs_high_as_highest():
    tinynn.set_matmul_precision("high")
    said = registry.select("cpu").describe()["matmul_precision"]
    assert said.startswith("high asked for, runs as highest (")


def test_a_configs_precision_holds_for_its_run_alone(workdir, monkeypatch):
    seen = []
    from tinynn import train_step
    plain = train_step.TrainStep._step

    def step(self):
        seen.append((precision.current(), self._backward_key()[2]))  # a captured step is keyed by it too
        return plain(self)
    monkeypatch.setattr(train_step.TrainStep, "_step", step)
    cfg = {"data": "data.txt", "max_steps": 2, "eval_interval": 2, "eval_steps": 1, "sample_tokens": 0,
           "checkpoint_interval": 0, "block_size": 8, "batch_size": 2, "matmul_precision": "high"}
    train(cfg, progress=False)
    assert seen and set(seen) == {("high", "high")}
    assert precision.current() == "highest" and precision.chosen() is None  # the environment's again
