"""The environment variables tinynn-core reads, in one place: `Settings.from_environment()` reads them into one
object, and the registry reads that when it chooses a backend for a run that named no device. A GPU backend
reads its own variables.

  TINYNN_DEVICE  the device when none is named (--device): auto (the default), cpu or gpu, in any case;
                 anything else is an error that names the variable

mpiexec's launch variables are read by distributed.py, which connects to MPI.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from tinynn.errors import TinynnError

DEVICES = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class Settings:
    device: str = "auto"

    @classmethod
    def from_environment(cls, environ=None) -> Settings:
        """The settings in `environ` (the process's environment when None); an unset or empty variable leaves its
        default. A value that is not one of the variable's choices raises a TinynnError naming the variable: the
        user set it, so it is never quietly replaced by the default."""
        environ = os.environ if environ is None else environ
        device = (environ.get("TINYNN_DEVICE") or "").strip().lower() or cls.device
        if device not in DEVICES:
            raise TinynnError(f"TINYNN_DEVICE must be one of {', '.join(DEVICES)}, got {environ['TINYNN_DEVICE']!r}")
        return cls(device=device)
