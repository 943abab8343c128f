"""The environment variables tinynn-core reads, in one place: `Settings.from_environment()` reads them into one
object, and the registry reads that when it chooses a backend for a run that named no device. A GPU backend
reads its own variables.

  TINYNN_DEVICE  the device when none is named (--device): auto (the default), cpu or gpu; checked where the
                 flag is (registry.select), so both give the same error

mpiexec's launch variables are read by distributed.py, which connects to MPI.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    device: str = "auto"

    @classmethod
    def from_environment(cls, environ=None) -> Settings:
        """The settings in `environ` (the process's environment when None); an unset or empty variable leaves its
        default."""
        environ = os.environ if environ is None else environ
        return cls(device=environ.get("TINYNN_DEVICE") or cls.device)
