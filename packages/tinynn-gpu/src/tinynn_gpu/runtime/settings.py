"""Every environment variable the GPU package reads, read once into one `Settings` object.

    TINYNN_WEBGPU=dawn|wgpu-native  the WebGPU implementation (webgpu.py; default wgpu-native)
    TINYNN_ADAPTER                  a substring of the adapter's name to use (context.py)
    TINYNN_ADAPTER_INDEX            which of several equally good adapters (MPI rank r sets r: tinynn/distributed.py)
    TINYNN_SHADER_CHECKS=1          keep the runtime checks in shaders, on either implementation (unchecked.py)
    TINYNN_SUBGROUPS=0              sum across workgroups without subgroup operations (ops/group_sum.py)
    TINYNN_ATTENTION_TILE           force the tiled attention forward's tile, ROWSxKEYSxSN, or 0 (ops/attention.py)
    TINYNN_ATTENTION_BACKWARD_TILE  the same for its backward, KEYSxQUERIESxSN, or 0
    TINYNN_ATTENTION_LAYOUT         force the per-row attention kernels' ROWSxSPLITS
    TINYNN_MATMUL                   one matmul variant for every shape, e.g. lesson8 (matmul/selection.py)
    TINYNN_AUTOTUNE=0|1             time matmul candidates on first use (default: on hardware adapters)
    TINYNN_CACHE_DIR                where the autotune choices are kept (default ~/.cache/tinynn)

`current()` is the object the package reads; `reload()` reads the environment again, for a test or a tool that
changes a variable while the process runs (what was compiled or chosen under the old value stays). A switch
(0 or 1) set to anything else is a TinynnError naming it: `TINYNN_SHADER_CHECKS=true` must not leave the checks
off without a word.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tinynn.errors import TinynnError


@dataclass(frozen=True)
class Settings:
    webgpu: str = ""  # "" (unset: webgpu.DEFAULT), or the implementation asked for, as written
    adapter: str = ""
    adapter_index: str = "0"
    shader_checks: bool = False
    subgroups: bool = True
    attention_tile: str | None = None
    attention_backward_tile: str | None = None
    attention_layout: str | None = None
    matmul: str | None = None
    autotune: bool | None = None  # None: on hardware adapters, off on software ones
    cache_dir: Path = Path.home() / ".cache" / "tinynn"

    @classmethod
    def read(cls, environ=os.environ) -> Settings:
        return cls(
            webgpu=environ.get("TINYNN_WEBGPU", "").strip().lower(),
            adapter=environ.get("TINYNN_ADAPTER", "").strip().lower(),
            adapter_index=environ.get("TINYNN_ADAPTER_INDEX", "").strip() or "0",  # unset or empty: the first
            shader_checks=_switch(environ, "TINYNN_SHADER_CHECKS", False),
            subgroups=_switch(environ, "TINYNN_SUBGROUPS", True),
            attention_tile=_tile(environ, "TINYNN_ATTENTION_TILE", "64x32x2 (rows, keys, keys a thread)", zero=True),
            attention_backward_tile=_tile(environ, "TINYNN_ATTENTION_BACKWARD_TILE",
                                          "32x32x2 (keys, queries, keys a thread)", zero=True),
            attention_layout=_tile(environ, "TINYNN_ATTENTION_LAYOUT", "16x4 (rows, splits)", zero=False),
            matmul=environ.get("TINYNN_MATMUL") or None,
            autotune=_switch(environ, "TINYNN_AUTOTUNE", None),
            cache_dir=Path(environ.get("TINYNN_CACHE_DIR") or Path.home() / ".cache" / "tinynn"))


def _switch(environ, name: str, default: bool | None) -> bool | None:
    """A 0|1 variable; unset or empty: the default."""
    value = environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise TinynnError(f"{name} must be 0 or 1, got {environ[name]!r}")
    return default if not value else value == "1"


def _tile(environ, name: str, example: str, zero: bool) -> str | None:
    """A tile written like `example` (or 0 where `zero`); unset or empty: None. Whether it fits the device and
    the head size is the kernel's to say, at its first use; a misspelt one is refused here, before a run that
    never reaches that kernel (generation, say) ignores it."""
    value = environ.get(name, "").strip().lower()
    parts = value.split("x")
    if value and not (zero and value == "0") and not (len(parts) == example.split()[0].count("x") + 1 and
                                                      all(part.isdigit() and int(part) > 0 for part in parts)):
        raise TinynnError(f"{name} must look like {example}{' or 0' if zero else ''}, got {environ[name]!r}")
    return value or None


_current: Settings | None = None  # read on first use: junk in a variable is then an error of opening the backend


def current() -> Settings:
    return _current or reload()


def reload() -> Settings:
    """Read the environment again; the new settings."""
    global _current
    _current = Settings.read()
    return _current
