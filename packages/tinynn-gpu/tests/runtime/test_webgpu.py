"""The WebGPU implementation, chosen once per process (runtime/webgpu.py): named by TINYNN_WEBGPU, never swapped
for the other when it cannot be used (the reason says why: a user's setting refused, so no GPU choice runs on the
CPU instead), reached by every module through one name, and compiling WGSL in its own dialect."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tinynn_gpu.runtime import context, webgpu

SRC = Path(__file__).parents[2] / "src" / "tinynn_gpu"

REASON = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {hidden!r}:
            raise ImportError("hidden by the test")
sys.meta_path.insert(0, Hide())
from tinynn import backends, registry
status = registry.load("gpu")
print(status.backend is None, status.reason)
"""


def gpu_reason(webgpu_variable: str, hidden: str, **variables) -> str:
    """The GPU backend's reason in a fresh process with TINYNN_WEBGPU (and `variables`) set and one package made
    unimportable."""
    env = {**os.environ, "TINYNN_WEBGPU": webgpu_variable, **variables}
    run = subprocess.run([sys.executable, "-c", REASON.format(hidden=hidden)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    unusable, reason = run.stdout.strip().split(" ", 1)
    assert unusable == "True", reason
    return reason


def test_dawn_asked_for_but_missing_is_the_reason_never_a_switch():
    assert ("wgpudawn is not importable (hidden by the test); TINYNN_WEBGPU=dawn asks for it (the tinynn-gpu[dawn] "
            "extra installs it)") in gpu_reason("dawn", "wgpudawn")


def test_dawn_finding_no_adapter_says_what_to_do():
    """Dawn refuses drivers wgpu-native takes (Mesa 22's lavapipe): the reason names the way out, not only the
    cause."""
    pytest.importorskip("wgpudawn")
    reason = gpu_reason("dawn", "nothing", VK_ICD_FILENAMES="/nonexistent")
    assert reason.startswith("no WebGPU adapter found by dawn") and \
        "point VK_ICD_FILENAMES at a newer Mesa's lvp_icd json, or unset TINYNN_WEBGPU for wgpu-native" in reason


def test_wgpu_native_asked_for_but_missing_is_the_reason():
    assert "wgpu is not importable (hidden by the test); TINYNN_WEBGPU=wgpu-native asks for it" in \
        gpu_reason("wgpu-native", "wgpu")


def test_an_unknown_implementation_is_named():
    assert "TINYNN_WEBGPU='metal' names no WebGPU implementation (choose wgpu-native or dawn)" in \
        gpu_reason("metal", "nothing")


def test_asking_for_it_refuses_the_setting_rather_than_run_elsewhere(setting, monkeypatch):
    """A TinynnError (a setting of the user's refused: core then fails `auto` as well as `gpu`)."""
    from tinynn.errors import TinynnError
    monkeypatch.setattr(webgpu, "_chosen", None)
    setting("TINYNN_WEBGPU", "vulkan")
    with pytest.raises(TinynnError, match="TINYNN_WEBGPU='vulkan' names no WebGPU implementation"):
        webgpu.chosen()


def test_the_api_is_imported_in_one_module():
    """Every module reaches wgpu-py's API through runtime/webgpu.py, which holds the chosen implementation's."""
    statement = re.compile(r"^\s*(import wgpu(dawn)?\b|from wgpu(dawn)? import)", re.MULTILINE)
    importers = [path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py") if statement.search(path.read_text())]
    assert importers in ([], ["runtime/webgpu.py"])


def test_dawn_enables_subgroups_where_a_kernel_uses_them():
    dawn = webgpu.Dawn(api=None, why="")
    uses = "@compute @workgroup_size(64) fn main(@builtin(subgroup_size) w: u32) { let s = subgroupAdd(1u); }"
    comment = "// a subgroup_size comment\n@compute @workgroup_size(64) fn main() {}"
    assert dawn.wgsl(uses, {"subgroups"}) == "enable subgroups;\n" + uses
    assert dawn.wgsl("enable subgroups;\n" + uses, {"subgroups"}) == "enable subgroups;\n" + uses  # once
    assert dawn.wgsl(comment, {"subgroups"}) == comment
    assert dawn.wgsl(uses, set()) == uses  # a device without them refuses the kernel, as on wgpu-native
    assert webgpu.WgpuNative(api=None, why="").wgsl(uses, {"subgroup"}) == uses  # naga refuses the directive


def test_the_context_runs_on_the_chosen_implementation(gpu):
    implementation = webgpu.chosen()
    assert gpu.ctx.implementation is implementation and webgpu.wgpu is implementation.api
    assert implementation.name == (os.environ.get("TINYNN_WEBGPU") or webgpu.DEFAULT)
    assert gpu.device_name.endswith(f" on {implementation.name}")
    assert gpu.describe()["webgpu"].startswith(f"{implementation.name} (")
    assert type(gpu.rt.native) is implementation.Calls, gpu.rt.native_reason
    if implementation.subgroups in gpu.ctx.adapter.features:
        assert gpu.ctx.subgroups and gpu.rt.subgroups is (os.environ.get("TINYNN_SUBGROUPS") != "0")


def test_the_device_is_opened_as_tinynn_asks(gpu):
    """With the adapter's own limits and each feature tinynn asks for by the implementation's names where the adapter
    has it; Dawn's also with its device toggles (shaders without robustness, timestamps not quantized) and the
    instance's (its experimental features), passed on to the adapter."""
    implementation, device = webgpu.chosen(), gpu.rt.device
    for name in context.WANTED_LIMITS:
        assert name not in gpu.ctx.adapter.limits or device.limits[name] == gpu.ctx.adapter.limits[name], name
    assert set(gpu.ctx.adapter.features) & set(implementation.features) <= set(device.features)
    if implementation.name == "dawn":
        from wgpudawn.backends.dawn import extras
        toggles = extras.get_toggles(device)
        assert "disable_robustness" in toggles and "timestamp_quantization" not in toggles
        assert "allow_unsafe_apis" in extras.get_toggles(gpu.ctx.adapter)
