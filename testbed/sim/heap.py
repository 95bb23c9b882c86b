"""Give freed heap memory back to the operating system (glibc), between a benchmark's phases.

numpy takes arrays below glibc's mmap threshold (which grows to 32 MiB once large arrays are
freed) from the process heap. A simulation step's dozens of such temporaries leave the heap
large and, once freed, mostly empty but still resident: at 10,000 NICs `sim sync` held
hundreds of MiB of freed heap across steps and into the solve (issue 10, item 6).
`release_free_heap` returns those free pages (``malloc_trim(0)``: every free page of the heap,
not only its top). Values are not touched; only the process's resident size shrinks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any


@cache
def _trim() -> Any:
    """``malloc_trim`` of the C library, or None where there is none (not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def release_free_heap() -> bool:
    """Return the heap's free pages to the operating system; True if the C library could
    (glibc's ``malloc_trim``), False where it has no such call (nothing is done then)."""
    fn = _trim()
    if fn is None:
        return False
    fn(0)
    return True
