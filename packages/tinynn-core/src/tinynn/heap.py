"""Freed memory kept for reuse by the C library's malloc (glibc), instead of given back to the kernel.

A training step frees and allocates the same large arrays every step. glibc hands blocks over its mmap threshold
back to the kernel when they are freed, and trims the top of its heap, so the next step's arrays of the same
sizes fault their pages in again, and more so with more threads: each fault and each unmapping contends for the
process's memory map, and an unmapping interrupts every core the process runs on (BENCHMARKS.md counts them).
Raising both thresholds keeps that memory in the heap for the next step's arrays; the step's peak is the same.

`keep_freed_memory()` runs once, when the NumPy backend starts; where the C library is not glibc it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform

# mallopt's parameters (malloc.h) and the values set: arrays up to the mmap limit come from the heap (glibc
# before 2.35 refuses more than 32 MiB), and up to TRIM_LIMIT of free memory at its top stays there
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_LIMITS, TRIM_LIMIT = (64 << 20, 32 << 20), 512 << 20

_mmap_limit: int | None = None


def keep_freed_memory() -> int:
    """Set glibc's thresholds once; the mmap threshold set (0 where none could be: macOS, Windows, musl)."""
    global _mmap_limit
    if _mmap_limit is not None:
        return _mmap_limit
    _mmap_limit = 0
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return 0
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return 0
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _mmap_limit = next((limit for limit in MMAP_LIMITS if mallopt(M_MMAP_THRESHOLD, limit)), 0)
    mallopt(M_TRIM_THRESHOLD, TRIM_LIMIT)
    return _mmap_limit
