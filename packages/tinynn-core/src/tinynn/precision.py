"""Matmul precision, as PyTorch's `torch.set_float32_matmul_precision`: which arithmetic float32 matmuls may use.

    "highest"  float32 products and sums (the default)
    "high"     tensor cores where the backend has them: operands rounded to a 10-bit mantissa (as TF32 has),
               products summed in float32. A backend without them runs "highest" and says why (`tinynn info`).

Three ways to set it, the later ones winning: TINYNN_MATMUL_PRECISION in the environment, a training config's
`matmul_precision` key, and `tinynn.set_matmul_precision()`. Backends read `current()` when they plan a matmul,
so a change applies to the next step; a captured training step is keyed by it and recorded again.
"""
from __future__ import annotations

import os

from tinynn.errors import TinynnError

PRECISIONS = ("highest", "high")
ENV = "TINYNN_MATMUL_PRECISION"
_set = None  # what set_matmul_precision chose; None: the environment's
_environment = None  # TINYNN_MATMUL_PRECISION's, read once (every matmul asks) until set_matmul_precision(None)


def check(value, source: str) -> str:
    """value as a precision, or a TinynnError naming `source` (where the value came from)."""
    name = value.strip().lower() if isinstance(value, str) else value
    if name not in PRECISIONS:
        raise TinynnError(f"{source} must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return name


def set_matmul_precision(precision: str | None) -> None:
    """Set the process's matmul precision ("highest" or "high"); None goes back to the environment's."""
    global _set, _environment
    _set, _environment = (None if precision is None else check(precision, "matmul precision")), None


def chosen() -> str | None:
    """What set_matmul_precision chose (None: nothing), to give back to it later."""
    return _set


def current() -> str:
    """The precision in force: set_matmul_precision's, else TINYNN_MATMUL_PRECISION's, else "highest"."""
    return _set if _set is not None else environment()


def environment() -> str:
    """TINYNN_MATMUL_PRECISION's precision, "highest" where it is unset; junk in it is a TinynnError naming it,
    whatever else sets the precision (the registry asks when it chooses a backend, so a run on the CPU, which
    never plans a matmul, refuses it too)."""
    global _environment
    if _environment is None:
        value = os.environ.get(ENV, "").strip()
        _environment = check(value, ENV) if value else "highest"
    return _environment
