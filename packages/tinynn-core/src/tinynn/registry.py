"""The backend registry: which backends are installed, which of them can run here, and which one runs.

Backends other than the NumPy reference are found through the entry-point group `tinynn.backends` and
imported only when first asked for. An entry point names a callable that returns a ready `Backend`
(backends.py) or raises `BackendUnavailable` with the reason; a failure is kept as that backend's reason. A
factory that raises `TinynnError` refuses a setting of the user's (an environment variable of its own, say):
that too is kept, and choosing a GPU (auto or gpu) then fails with it rather than run on the CPU unasked.

Device choice (`--device` on the CLI, `TINYNN_DEVICE` in the environment, see settings.py):
  auto  a GPU backend when one is installed and reports a hardware adapter, else the CPU, silently;
  cpu   the NumPy backend;
  gpu   the first usable GPU backend (a software adapter too); none usable is an error naming the reason.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from tinynn import precision
from tinynn.backends import INTERFACE_VERSION, Backend, BackendUnavailable, reference
from tinynn.errors import TinynnError
from tinynn.settings import DEVICES, Settings

ENTRY_POINT_GROUP = "tinynn.backends"


@dataclass
class BackendStatus:
    name: str
    backend: Backend | None
    reason: str  # why it is not usable, or "" when it is
    user_error: bool = False  # the reason is a setting of the user's, which no device choice may step around


_entry_points: dict[str, EntryPoint] | None = None
_loaded: dict[str, BackendStatus] = {}
_default: Backend | None = None


def discovered() -> dict[str, EntryPoint]:
    """The installed backends' entry points, listed once and cached; nothing is imported."""
    global _entry_points
    if _entry_points is None:
        _entry_points = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return _entry_points


def load(name: str, entry_point: EntryPoint | None = None) -> BackendStatus:
    """Import and create one backend (once); a failure becomes a recorded reason."""
    if name in _loaded:
        return _loaded[name]
    if name == "cpu":
        status = BackendStatus("cpu", reference(), "")
    else:
        ep = entry_point or discovered().get(name)
        if ep is None:
            status = BackendStatus(name, None, f"no backend named {name!r} is installed")
        else:
            try:
                status = _checked(name, ep.load()())
            except BackendUnavailable as e:
                status = BackendStatus(name, None, str(e))
            except TinynnError as e:
                status = BackendStatus(name, None, str(e), user_error=True)
            except Exception as e:  # a broken plugin must not break core: record why, fall back
                status = BackendStatus(name, None, f"failed to load ({type(e).__name__}: {e})")
    _loaded[name] = status
    return status


def _checked(name: str, backend: Backend) -> BackendStatus:
    """A created backend, refused when it implements another version of the interface than core's."""
    if backend.interface_version != INTERFACE_VERSION:
        return BackendStatus(name, None, f"it implements backend interface {backend.interface_version}, this "
                             f"tinynn-core has interface {INTERFACE_VERSION}: install matching versions "
                             "(pip install -U tinynn-core tinynn-gpu)")
    return BackendStatus(name, backend, "")


def statuses() -> list[BackendStatus]:
    """Every known backend, loading each: for `tinynn info`."""
    return [load("cpu")] + [load(name) for name in sorted(discovered())]


def select(device: str | None = None) -> Backend:
    """The backend for `device` (auto, cpu or gpu); None takes the environment's (settings.py), default auto.
    An error names where the device was asked for: the flag, or TINYNN_DEVICE."""
    asked = f"--device {device}" if device else None
    device = (device or Settings.from_environment().device).lower()
    precision.environment()  # junk there is an error on every device, before any work
    if device not in DEVICES:
        raise TinynnError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return reference()
    backend, reasons = _gpu_for(device)
    if backend is not None:
        return backend
    if device == "gpu":
        raise TinynnError(f"{asked or 'TINYNN_DEVICE=gpu'}: no usable GPU backend ({'; '.join(reasons)})")
    return reference()


def selection(device: str | None = None) -> tuple[Backend | None, str]:
    """`select`'s backend and "", or None and the reason it cannot run: for `tinynn info`, which reports every
    backend either way, then fails when the device asked for (by the flag or TINYNN_DEVICE) cannot run."""
    try:
        return select(device), ""
    except TinynnError as e:
        return None, str(e)


def why_not_gpu() -> str:
    """One line saying why `auto` runs on the CPU (or refuses to run), or "" when it would use a GPU."""
    try:
        backend, reasons = _gpu_for("auto")
    except TinynnError as e:
        return str(e)
    return "" if backend is not None else "; ".join(reasons)


def _gpu_for(device: str) -> tuple[Backend | None, list[str]]:
    """The first usable GPU backend for `device` (auto refuses software adapters), or None and why not."""
    reasons = []
    for name in sorted(discovered()):
        status = load(name)
        if status.user_error:
            raise TinynnError(f"{name}: {status.reason}")
        if status.backend is None:
            reasons.append(f"{name}: {status.reason}")
        elif device == "auto" and status.backend.is_software:
            reasons.append(f"{name}: only a software adapter ({status.backend.device_name}); "
                           "use --device gpu to run on it anyway")
        else:
            return status.backend, []
    return None, reasons or ["no GPU backend is installed (pip install tinynn-gpu)"]


def set_default(device: str | Backend | None) -> Backend:
    """Choose the backend that new tensors use when none is named."""
    global _default
    _default = device if isinstance(device, Backend) else select(device)
    if device == "gpu" and _default.is_software:
        warnings.warn(f"running on a software adapter ({_default.device_name}): expect it to be slow",
                      stacklevel=2)
    return _default


def default() -> Backend:
    global _default
    if _default is None:
        _default = select(None)
    return _default


def reset_discovery() -> None:
    """Forget discovered and loaded backends (tests use it after changing entry points)."""
    global _entry_points, _default
    _entry_points, _default = None, None
    _loaded.clear()
