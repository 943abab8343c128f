"""Shader modules without wgpu's runtime checks: used where the probe finds them working, refused with a
reason otherwise, and compile errors still raise."""
import pytest

from tinynn_gpu.runtime import context, unchecked


def test_the_backend_compiles_without_runtime_checks(gpu):
    """wgpu is pinned to the version that has trusted modules, so on the test adapter they must work."""
    assert gpu.ctx.unchecked is not None, gpu.ctx.checks_reason
    assert gpu.describe()["shader_runtime_checks"] == "off"


def test_the_setting_keeps_the_checks(setting, gpu, monkeypatch):
    setting("TINYNN_SHADER_CHECKS", "1")
    assert unchecked.probe(gpu.rt.device) == (None, "TINYNN_SHADER_CHECKS=1")
    checked = context.GpuContext(gpu.ctx.adapter, gpu.rt.device, gpu.ctx.info, gpu.ctx.limits, gpu.ctx.features,
                                 checks_reason="TINYNN_SHADER_CHECKS=1")
    assert checked.describe()["shader_runtime_checks"] == "on (TINYNN_SHADER_CHECKS=1)"
    module = checked.compile("checked probe", unchecked.PROBE_WGSL)  # wgpu-py's own create_shader_module
    gpu.rt.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})


def test_a_missing_function_is_a_reason(gpu, monkeypatch):
    from wgpu.backends.wgpu_native import _api
    monkeypatch.setattr(_api, "libf", object())
    compile, reason = unchecked.probe(gpu.rt.device)
    assert compile is None and "wgpuDeviceCreateShaderModuleTrusted" in reason


def test_a_wrong_probe_result_is_a_reason(gpu, monkeypatch):
    monkeypatch.setattr(unchecked, "PROBE_WGSL", unchecked.PROBE_WGSL.replace("* 2.0", "* 3.0"))
    assert unchecked.probe(gpu.rt.device) == (None, "a kernel compiled without runtime checks wrote wrong values")


def test_invalid_wgsl_still_raises(gpu):
    with pytest.raises(Exception, match="expected"):
        gpu.ctx.compile("broken", "fn main( {")



def test_tinynn_info_says_how_the_gpu_compiles_and_records(gpu, capsys):
    from tinynn.cli import main
    assert main(["info", "--device", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "  shader_runtime_checks: off\n" in out and "  recording: direct wgpu-native calls" in out
