"""Shader modules without the implementation's runtime checks: used where the probe finds them working, refused
with a reason otherwise (also on Dawn with TINYNN_SHADER_CHECKS=1, whose device then keeps its robustness), and
compile errors still raise."""
import pytest

from tinynn_gpu.runtime import context, unchecked, webgpu


def test_the_backend_compiles_without_runtime_checks(gpu):
    """wgpu-py and wgpudawn are pinned to versions that have the way, so on the test adapter it must work."""
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


def test_a_missing_way_is_a_reason(gpu, monkeypatch):
    """wgpu-native without its trusted-module function; a Dawn device without its disable_robustness toggle."""
    if webgpu.chosen().name == "wgpu-native":
        from wgpu.backends.wgpu_native import _api
        monkeypatch.setattr(_api, "libf", object())
        missing = "wgpuDeviceCreateShaderModuleTrusted"
    else:
        from wgpudawn.backends.dawn import extras
        monkeypatch.setattr(extras, "get_toggles", lambda device: [])
        missing = "disable_robustness"
    compile, reason = unchecked.probe(gpu.rt.device)
    assert compile is None and missing in reason


def test_checks_asked_for_reach_the_device_where_it_decides(gpu):
    """TINYNN_SHADER_CHECKS=1 opens the device with `checks`: Dawn's then keeps its robustness, so no module of it
    can drop the checks; wgpu-native decides per module (the setting acts in `probe`), so its device is the same."""
    implementation = webgpu.chosen()
    adapter = context.choose_adapter(implementation.api.gpu.enumerate_adapters_sync())  # one adapter, one device
    compile, reason = implementation.unchecked(implementation.request_device(adapter, {}, [], checks=True))
    if implementation.name == "dawn":
        assert compile is None and "disable_robustness" in reason
    else:
        assert compile is not None and reason == ""


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
    name = webgpu.chosen().name
    assert "  shader_runtime_checks: off\n" in out and f"  recording: direct {name} calls" in out
    assert f"  webgpu: {name} (" in out and f" on {name} (" in out  # the section, and the device's line
