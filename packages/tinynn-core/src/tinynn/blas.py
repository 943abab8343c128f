"""The thread count of the BLAS library under NumPy's matrix products, read and set through ctypes.

tinynn's thread pool (parallel.py) cuts a large product into tiles and runs each tile on one BLAS thread.
BLAS must not thread them again: its own threads would then wait on each other's calls, and after a product they
keep spinning for a while, taking the cores that the pool's next op needs. NumPy offers no call for the count,
so this module finds the OpenBLAS library that NumPy loaded (the one its wheels bundle) and calls OpenBLAS's
own getter and setter. Where there is none (NumPy built on another BLAS), `available()` is False and the
products stay whole, threaded by that BLAS as it likes.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os

import numpy as np

# OpenBLAS's names for the calls, plain and as NumPy's wheels (scipy-openblas, 64-bit integers) prefix them
_NAMES = [("openblas_get_num_threads", "openblas_set_num_threads"),
          ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
          ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
          ("openblas_get_num_threads64_", "openblas_set_num_threads64_")]

# OpenBLAS runs a product of at most 65536 x 4 multiply-adds (GEMM_MULTITHREAD_THRESHOLD's default) on the thread
# that calls it, whatever its thread count: products that small may run on the pool's threads side by side
SMALL_PRODUCT = 1 << 18

_calls: tuple | None = None
_looked = False


def _candidates() -> list[str]:
    """Paths of OpenBLAS libraries loaded in this process (Linux; NumPy's own first, where SciPy's is loaded too),
    else those NumPy's wheel carries."""
    try:
        with open("/proc/self/maps") as maps:
            loaded = {line.split()[-1] for line in maps if "openblas" in line.lower()}
        if loaded:
            return sorted(loaded, key=lambda path: ("numpy" not in path, path))
    except OSError:  # no /proc (macOS, Windows)
        pass
    here = os.path.dirname(np.__file__)
    return sorted(glob.glob(os.path.join(here, "..", "numpy.libs", "*openblas*")) +
                  glob.glob(os.path.join(here, ".dylibs", "*openblas*")))


def _find() -> tuple | None:
    """(get, set) of the OpenBLAS NumPy uses, or None."""
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get, put in _NAMES:
            if hasattr(lib, get) and hasattr(lib, put):
                getter, setter = getattr(lib, get), getattr(lib, put)
                getter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
                return getter, setter
    return None


def _get_calls() -> tuple | None:
    global _calls, _looked
    if not _looked:
        _calls, _looked = _find(), True
    return _calls


def available() -> bool:
    """Whether this module can set the BLAS's thread count."""
    return _get_calls() is not None


def threads() -> int | None:
    """BLAS's thread count now, or None where it cannot be read."""
    calls = _get_calls()
    return None if calls is None else int(calls[0]())


@contextlib.contextmanager
def held_to(count: int):
    """BLAS on `count` threads inside, as it was after (nothing where its count cannot be set)."""
    calls = _get_calls()
    before = None if calls is None else calls[0]()
    if before is not None and before != count:
        calls[1](count)
    try:
        yield
    finally:
        if before is not None and before != count:
            calls[1](before)


def one_thread():
    """BLAS on one thread inside: every product runs on the thread that calls it."""
    return held_to(1)
