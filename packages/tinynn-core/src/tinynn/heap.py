"""Freed memory kept for reuse by the C library's malloc (glibc), instead of given back to the kernel.

A training step frees and allocates the same large arrays every step. glibc hands blocks over its mmap threshold
back to the kernel when they are freed, and trims the top of its heap, so the next step's arrays of the same
sizes fault their pages in again: the lesson step took about 16,000 page faults and 30-50 ms of kernel time a
step, more with more threads (each fault and each unmapping contends for the process's memory map, and an
unmapping interrupts every core the process runs on). Raising both thresholds keeps that memory in the heap,
for the next step's arrays, at no cost in peak memory: the step reaches the same peak every time.

`keep_freed_memory()` runs once, when the NumPy backend starts; where the C library is not glibc it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform

# mallopt's parameters (malloc.h) and the values set: arrays up to MMAP_LIMIT come from the heap, and up to
# TRIM_LIMIT of free memory at its top stays there
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_LIMIT, TRIM_LIMIT = 64 << 20, 512 << 20

_done = False


def keep_freed_memory() -> bool:
    """Set glibc's thresholds once; whether they are set (False elsewhere: macOS, Windows, musl)."""
    global _done
    if _done:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_LIMIT)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_LIMIT))
    return _done
