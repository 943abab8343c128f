"""`tinynn info`: the report, and its exit code for scripts: 2, with the reason, when the device asked for (by
--device or TINYNN_DEVICE) cannot run here."""
import json
import os
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

from tinynn import registry
from tinynn.cli import main

# `cmd_info`'s exit code is cli.py's, and the GPU backend's reading of its variables is tinynn-gpu's context.py,
# changed by the diffs in this branch's report; remove each mark with its diff


@pytest.fixture
def no_gpu(monkeypatch):
    """A GPU backend that is installed but finds no adapter."""
    registry.reset_discovery()
    monkeypatch.setattr(registry, "_entry_points", {
        "gpu": EntryPoint("gpu", "fake_backends:no_adapter", registry.ENTRY_POINT_GROUP)})
    monkeypatch.delenv("TINYNN_DEVICE", raising=False)
    yield
    registry.reset_discovery()


def test_device_gpu_without_a_usable_gpu_reports_then_exits_2_with_the_reason(no_gpu, capsys):
    assert main(["info", "--device", "gpu"]) == 2
    out, err = capsys.readouterr()
    assert "gpu    unavailable  no adapter found (fake)" in out  # the report still prints: it says what is here
    assert "see TINYNN_DEVICE" not in out
    assert err == "tinynn: error: --device gpu: no usable GPU backend (gpu: no adapter found (fake))\n"


def test_the_json_report_carries_the_error_and_exits_2(no_gpu, capsys):
    assert main(["info", "--json", "--device", "gpu"]) == 2
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["active"] is None and report["error"].startswith("--device gpu: no usable GPU backend")
    assert err.startswith("tinynn: error: --device gpu")


def test_junk_in_TINYNN_DEVICE_is_named_and_exits_2(no_gpu, monkeypatch, capsys):
    monkeypatch.setenv("TINYNN_DEVICE", "junk")
    assert main(["info"]) == 2
    assert capsys.readouterr().err == "tinynn: error: TINYNN_DEVICE must be one of auto, cpu, gpu, got 'junk'\n"


def test_auto_without_a_gpu_is_not_an_error(no_gpu, capsys):
    assert main(["info"]) == 0  # nothing was asked for: auto runs on the CPU, and the report says why
    out = capsys.readouterr().out
    assert "active: cpu (NumPy)" in out and "GPU not used: gpu: no adapter found (fake)" in out


def info_in_a_process(*flags, **environ):
    """`tinynn info` with the real GPU backend, in a process of its own: it reads its variables once, when it
    starts."""
    env = {**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp"), **environ}
    env.pop("TINYNN_DEVICE", None)
    return subprocess.run([sys.executable, "-m", "tinynn.cli", "info", *flags], env=env, capture_output=True,
                          text=True, timeout=120)


gpu_installed = pytest.mark.skipif(not registry.discovered(), reason="tinynn-gpu is not installed")


@gpu_installed
def test_junk_in_TINYNN_ADAPTER_INDEX_is_named_and_exits_2():
    done = info_in_a_process("--device", "gpu", TINYNN_ADAPTER_INDEX="x")
    assert done.returncode == 2, done
    last = done.stderr.splitlines()[-1]
    assert last.startswith("tinynn: error: ") and "TINYNN_ADAPTER_INDEX must be a whole number, got 'x'" in last


@gpu_installed
def test_junk_in_TINYNN_ADAPTER_INDEX_is_an_error_for_auto_too():
    """Not a quiet fallback to the CPU: the user set it to choose a GPU."""
    done = info_in_a_process(TINYNN_ADAPTER_INDEX="x")
    assert done.returncode == 2, done
    assert done.stderr.splitlines()[-1] == "tinynn: error: gpu: TINYNN_ADAPTER_INDEX must be a whole number, got 'x'"


@gpu_installed
def test_an_empty_TINYNN_ADAPTER_INDEX_leaves_its_default():
    done = info_in_a_process("--device", "gpu", TINYNN_ADAPTER_INDEX="")
    assert done.returncode == 0 and "active: gpu" in done.stdout, done
