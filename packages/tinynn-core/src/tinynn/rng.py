"""The process's random-number generator: parameter init, dropout masks and batch sampling draw from it, so
`manual_seed` makes a run repeatable and a checkpoint can save and restore where the stream stands."""
from __future__ import annotations

import numpy as np

_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    global _generator
    _generator = np.random.default_rng(seed)


def generator() -> np.random.Generator:
    return _generator


def get_state() -> dict:
    return _generator.bit_generator.state


def set_state(state: dict) -> None:
    _generator.bit_generator.state = state


def valid_state(state) -> bool:
    """Whether `set_state` takes `state` (a saved state of this kind of generator)."""
    try:
        np.random.default_rng().bit_generator.state = state
    except (TypeError, ValueError, KeyError):
        return False
    return True
