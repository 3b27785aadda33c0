"""Memory the operator freed goes back to the OS.

CPython and glibc keep freed memory for reuse, so a long-running operator's RSS stays at the high-water mark of
its busiest minute (a burst of jobs, a 512-pod gang) for good. The scheduler calls this after activity.
"""

from __future__ import annotations

import ctypes
import gc
from typing import Any

__all__ = ["return_freed_memory"]


def _libc() -> Any:
    try:
        return ctypes.CDLL("libc.so.6")  # glibc: the operator's image (Debian); elsewhere nothing is trimmed
    except OSError:
        return None


_LIBC = _libc()


def return_freed_memory() -> None:
    """Collect garbage cycles, then ask glibc to return its free heap pages (malloc_trim)."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
