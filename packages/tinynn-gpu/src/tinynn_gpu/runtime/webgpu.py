"""The WebGPU implementation under the GPU package, chosen once per process, and what each does its own way.

    TINYNN_WEBGPU=wgpu-native   wgpu-py on wgpu-native (`import wgpu`): the default (DEFAULT_REASON says why)
    TINYNN_WEBGPU=dawn          wgpudawn, the wgpu-py API on Dawn (`import wgpudawn as wgpu`): `tinynn-gpu[dawn]`

Both speak wgpu-py's API, so the package reaches it through this module alone: `from tinynn_gpu.runtime.webgpu
import wgpu` gives the chosen implementation's module, imported on first use. One that is asked for by
TINYNN_WEBGPU but cannot be imported, or a value naming none, is a setting of the user's refused: `TinynnError`
with the reason, so that no device choice runs on the other implementation or quietly on the CPU instead (the
default's import failure is an ordinary `BackendUnavailable`). What the two do
differently is a method or attribute of `Implementation`, written once for each:
- `start`: Dawn's instance toggles, set before the first adapter request: `allow_unsafe_apis` (its experimental
  features) and `vulkan_enable_f16_on_nvidia` (f16 on NVIDIA drivers before 615.71, which Dawn offers only from
  there on);
- `features` and `request_device`: the features asked for by each one's names (wgpu-native's `subgroup` is
  Dawn's `subgroups`; Dawn's f16 and subgroup matrices, for the tensor-core matmul), and Dawn's device toggles:
  `disable_robustness` (shaders without bounds clamps, as unchecked.py does for wgpu-native; not with
  TINYNN_SHADER_CHECKS=1) and unquantized timestamps (autotuning times kernels);
- `threads_may_record`: Dawn's objects may be used from a second thread only on a device opened with
  `implicit-device-synchronization` (asked for where offered); a replay is recorded on a worker thread only then;
- `wgsl`: the dialect: Tint wants `enable subgroups;` before subgroup builtins, which naga refuses;
- `unchecked`: how a module is compiled without runtime checks (unchecked.py probes it);
- `cffi` and `Calls`: webgpu.h's functions, for the direct recording path (native.py), and the class that calls
  them (wgpu-native numbers its submissions and polls the device; Dawn waits on the map's future).

`chosen()` is the implementation; `describe()` says which, its versions and why, for `tinynn info`.
"""
from __future__ import annotations

import importlib
import re

from tinynn.backends import BackendUnavailable
from tinynn.errors import TinynnError
from tinynn_gpu.runtime import settings

DEFAULT = "wgpu-native"
DEFAULT_REASON = ("the default: tinynn's kernels were tuned and its speed measured on it; Dawn (TINYNN_WEBGPU=dawn) "
                  "is used when asked for")
SUBGROUP_BUILTIN = re.compile(r"\b(subgroup[A-Z_]\w*|num_subgroups)\b")


class Implementation:
    """What one WebGPU implementation does its own way (the module docstring lists it); a subclass per
    implementation, its instance made once per process by `chosen`."""
    name = ""  # as TINYNN_WEBGPU names it
    package = ""  # the Python package that provides it
    subgroups = ""  # the subgroup feature's name
    features = ()  # the features asked for where the adapter has them
    no_adapter = "no Vulkan, Metal or DX12 driver?"  # what to check when it finds no adapter

    def __init__(self, api, why: str):
        self.api, self.why = api, why  # the wgpu-py module; why it was chosen
        self.notes = []  # what did not go as asked at start (shown by describe)

    def start(self) -> None:
        """Before the first adapter request."""

    def request_device(self, adapter, limits: dict, features: list, checks: bool):
        return adapter.request_device_sync(required_limits=limits, required_features=features)

    def threads_may_record(self, features: set) -> bool:
        """Whether a second thread may record commands on a device with these features."""
        return True

    def wgsl(self, code: str, features: set) -> str:
        """The WGSL as this implementation compiles it."""
        return code

    # where the rest lives, by name: wgpu-py's backend module over the native library (its ffi, lib, version
    # and, in its _api, libf), the API's and the library's names in `versions`, unchecked.py's way of compiling
    # without runtime checks, and native.py's NativeCalls subclass
    native_module = ""
    api_name = native_name = ""
    unchecked_way = ""
    calls = ""

    def versions(self) -> str:
        native = importlib.import_module(self.native_module)
        return f"{self.api_name} {self.api.__version__}, {self.native_name} {native.__version__}"

    def unchecked(self, device):
        """(compile(label, code), "") making modules without runtime checks on this device, else (None, why)."""
        from tinynn_gpu.runtime import unchecked
        return getattr(unchecked, self.unchecked_way)(device)

    def cffi(self):
        """(ffi, lib, libf): webgpu.h's functions through cffi, and wgpu-py's checked wrappers of them."""
        native = importlib.import_module(self.native_module)
        return native.ffi, native.lib, importlib.import_module(f"{self.native_module}._api").libf

    @property
    def Calls(self):
        """The native.NativeCalls subclass for this implementation."""
        from tinynn_gpu.runtime import native
        return getattr(native, self.calls)

    def describe(self) -> str:
        return f"{self.name} ({self.versions()}), {self.why}" + "".join(f"; {note}" for note in self.notes)


class WgpuNative(Implementation):
    name, package, subgroups = "wgpu-native", "wgpu", "subgroup"
    features = ("timestamp-query", "timestamp-query-inside-passes", "subgroup")
    native_module, api_name, native_name = "wgpu.backends.wgpu_native", "wgpu-py", "wgpu-native"
    unchecked_way, calls = "trusted_modules", "WgpuNativeCalls"


class Dawn(Implementation):
    name, package, subgroups = "dawn", "wgpudawn", "subgroups"
    features = ("timestamp-query", "chromium-experimental-timestamp-query-inside-passes", "subgroups",
                "implicit-device-synchronization", "shader-f16", "chromium-experimental-subgroup-matrix")
    no_adapter = ("no Vulkan, Metal or DX12 driver that Dawn accepts? It logs why it refuses one; Mesa's lavapipe "
                  "must be 25 or newer: point VK_ICD_FILENAMES at a newer Mesa's lvp_icd json, or unset "
                  "TINYNN_WEBGPU for wgpu-native")
    native_module, api_name, native_name = "wgpudawn.backends.dawn", "wgpudawn", "Dawn"
    unchecked_way, calls = "robustness_off", "DawnCalls"
    INSTANCE_TOGGLES = ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia")
    started = False

    def start(self) -> None:
        from wgpudawn.backends.dawn import _helpers, extras
        if self.started:
            return
        self.started = True
        if _helpers._the_instance is None:
            extras.set_instance_extras(enable_toggles=self.INSTANCE_TOGGLES)
        else:  # e.g. a tool made its own adapter first
            self.notes.append(f"Dawn's instance was made before tinynn could set {', '.join(self.INSTANCE_TOGGLES)}")

    def request_device(self, adapter, limits: dict, features: list, checks: bool):
        from wgpudawn.backends.dawn import extras
        return extras.request_device_sync(adapter, required_limits=limits, required_features=features,
                                          enable_toggles=() if checks else ("disable_robustness",),
                                          disable_toggles=("timestamp_quantization",))

    def threads_may_record(self, features: set) -> bool:
        return "implicit-device-synchronization" in features

    def wgsl(self, code: str, features: set) -> str:
        if self.subgroups in features and "enable subgroups;" not in code and \
                SUBGROUP_BUILTIN.search(re.sub(r"//[^\n]*", "", code)):
            return "enable subgroups;\n" + code
        return code


IMPLEMENTATIONS = {cls.name: cls for cls in (WgpuNative, Dawn)}
_chosen = None


def chosen() -> Implementation:
    """The implementation of this process: the one TINYNN_WEBGPU names, else DEFAULT, imported on the first call."""
    global _chosen
    if _chosen is None:
        asked = settings.current().webgpu
        if asked and asked not in IMPLEMENTATIONS:
            raise TinynnError(f"TINYNN_WEBGPU={asked!r} names no WebGPU implementation "
                              f"(choose {' or '.join(IMPLEMENTATIONS)})")
        cls = IMPLEMENTATIONS[asked or DEFAULT]
        why = f"asked for by TINYNN_WEBGPU={asked}" if asked else DEFAULT_REASON
        try:
            api = __import__(cls.package)
        except ImportError as e:
            if not asked:
                raise BackendUnavailable(f"{cls.package} is not importable ({e})") from None
            extra = " (the tinynn-gpu[dawn] extra installs it)" if cls is Dawn else ""
            raise TinynnError(f"{cls.package} is not importable ({e}); TINYNN_WEBGPU={asked} asks for it{extra}") \
                from None
        _chosen = cls(api, why)
    return _chosen


def describe() -> str:
    return chosen().describe()


def __getattr__(name: str):
    if name == "wgpu":  # `from tinynn_gpu.runtime.webgpu import wgpu`
        return chosen().api
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
