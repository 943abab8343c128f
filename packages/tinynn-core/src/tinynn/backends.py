"""Backends: where a Tensor's numbers live and how its operations run.

Core computes only through a `Backend`. The NumPy backend (numpy_backend.py) is the reference; other backends
are found through the entry-point group `tinynn.backends` and imported only when first asked for. An entry
point names a callable that returns a ready `Backend` or raises `BackendUnavailable` with the reason.

Device choice (`--device` on the CLI, `TINYNN_DEVICE` in the environment):
  auto  a GPU backend when one is installed and reports a hardware adapter, else the CPU, silently;
  cpu   the NumPy backend;
  gpu   the first usable GPU backend (a software adapter too); none usable is an error naming the reason.
"""
from __future__ import annotations

import os
import warnings
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

import numpy as np

from tinynn.errors import TinynnError

ENTRY_POINT_GROUP = "tinynn.backends"
DEVICES = ("auto", "cpu", "gpu")


class BackendUnavailable(Exception):
    """Raised by a backend factory that cannot run here (no adapter, no driver); the message is the reason."""


class Backend:
    """The operations core needs, at the level a GPU kernel implements them.

    Arrays are opaque to core except for `.shape` and `.dtype`. Every operation below has a default that
    moves the inputs to NumPy, runs the reference and moves the result back: a backend that lacks an op is
    slow there (counted in `fallbacks`), never wrong.
    """

    name = "abstract"
    is_gpu = False
    is_software = False  # a CPU-emulated adapter (lavapipe): usable, but `auto` does not pick it
    device_name = ""

    def __init__(self):
        self.fallbacks = Counter()

    def describe(self) -> dict:
        return {"backend": self.name, "device": self.device_name, "software": self.is_software}

    # --- transfer and creation (every backend implements these) ---
    def from_numpy(self, x: np.ndarray):
        raise NotImplementedError

    def to_numpy(self, a) -> np.ndarray:
        raise NotImplementedError

    def is_array(self, a) -> bool:
        raise NotImplementedError

    def write_(self, dst, src: np.ndarray) -> None:
        """Overwrite an existing array with host values (same shape), keeping its storage."""
        raise NotImplementedError

    def sync(self) -> None:
        """Wait until all work recorded so far has finished."""

    def capture(self, fn):
        """A callable equivalent to `fn()` (no arguments) that the backend may record once and replay.

        fn must read its per-call inputs from arrays that live across calls (written with `write_`
        before each call) and return a Tensor. The default runs fn every time; a GPU backend replays
        the recorded dispatches without running Python again.
        """
        return fn

    # --- everything else falls back to the reference (see _install_fallbacks) ---
    OPS = (
        # creation and layout
        "full", "reshape", "permute", "broadcast_to", "getitem", "getitem_backward", "concatenate",
        # elementwise
        "unary", "unary_backward", "binary", "scalar", "causal_fill", "dropout_mask",
        # reductions and matmul
        "sum", "max", "matmul",
        # fused neural-network ops
        "softmax_forward", "softmax_backward", "log_softmax_forward", "log_softmax_backward",
        "layernorm_forward", "layernorm_backward", "cross_entropy_forward", "cross_entropy_backward",
        "embedding_forward", "embedding_backward",
        # optimizer
        "global_norm", "clip_coefficient",
    )
    INPLACE_OPS = ("adamw_update_", "sgd_update_")


def reference() -> Backend:
    from tinynn.numpy_backend import NUMPY
    return NUMPY


def _install_fallbacks():
    def to_numpy(backend, x):
        if isinstance(x, (list, tuple)):
            return type(x)(to_numpy(backend, v) for v in x)
        return backend.to_numpy(x) if backend.is_array(x) else x

    def from_numpy(backend, x):
        if isinstance(x, (list, tuple)):
            return type(x)(from_numpy(backend, v) for v in x)
        return backend.from_numpy(x) if isinstance(x, np.ndarray) else x

    def make(name, inplace):
        def op(self, *args, **kwargs):
            self.fallbacks[name] += 1
            np_args = to_numpy(self, args)
            out = getattr(reference(), name)(*np_args, **kwargs)
            if inplace:  # write the reference's in-place results back into this backend's arrays
                for dst, src in zip(_flatten(args), _flatten(np_args)):
                    if self.is_array(dst):
                        self.write_(dst, src)
                return None
            return from_numpy(self, out)
        op.__name__ = name
        op.__doc__ = f"NumPy fallback for `{name}`."
        return op

    for name in Backend.OPS:
        setattr(Backend, name, make(name, inplace=False))
    for name in Backend.INPLACE_OPS:
        setattr(Backend, name, make(name, inplace=True))


def _flatten(xs):
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flatten(x)
        else:
            yield x


_install_fallbacks()


# --- discovery and selection ---

@dataclass
class BackendStatus:
    name: str
    backend: Backend | None
    reason: str  # why it is not usable, or "" when it is


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
                status = BackendStatus(name, ep.load()(), "")
            except BackendUnavailable as e:
                status = BackendStatus(name, None, str(e))
            except Exception as e:  # a broken plugin must not break core: record why, fall back
                status = BackendStatus(name, None, f"failed to load ({type(e).__name__}: {e})")
    _loaded[name] = status
    return status


def statuses() -> list[BackendStatus]:
    """Every known backend, loading each: for `tinynn info`."""
    return [load("cpu")] + [load(name) for name in sorted(discovered())]


def select(device: str | None = None) -> Backend:
    """The backend for `device` (auto, cpu or gpu); None reads TINYNN_DEVICE, default auto."""
    device = (device or os.environ.get("TINYNN_DEVICE") or "auto").lower()
    if device not in DEVICES:
        raise TinynnError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return reference()
    reasons = []
    for name in sorted(discovered()):
        status = load(name)
        if status.backend is None:
            reasons.append(f"{name}: {status.reason}")
        elif device == "auto" and status.backend.is_software:
            reasons.append(f"{name}: only a software adapter ({status.backend.device_name}); "
                           "use --device gpu to run on it anyway")
        else:
            return status.backend
    if device == "gpu":
        why = "; ".join(reasons) or "no GPU backend is installed (pip install tinynn-gpu)"
        raise TinynnError(f"--device gpu: no usable GPU backend ({why})")
    return reference()


def why_not_gpu() -> str:
    """One line saying why `auto` runs on the CPU, or "" when it would use a GPU."""
    if select("auto").is_gpu:
        return ""
    reasons = []
    for name in sorted(discovered()):
        status = load(name)
        if status.backend is None:
            reasons.append(f"{name}: {status.reason}")
        elif status.backend.is_software:
            reasons.append(f"{name}: only a software adapter ({status.backend.device_name})")
    return "; ".join(reasons) or "no GPU backend is installed (pip install tinynn-gpu)"


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
