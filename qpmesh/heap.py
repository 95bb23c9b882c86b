"""How qpmesh's processes ask the C allocator to keep freed memory.

The controller's pipeline makes and frees arrays of a few MB hundreds of times a second (a
window's ~10^6 delays are 8 MB a column). glibc's ``malloc`` serves blocks past its mmap
threshold (128 KB, raised on the fly up to the largest block freed) with fresh ``mmap``
pages and trims the heap's free top past twice that, so a block that size, freed and asked
for again, comes back as new pages the kernel zeroes on first touch: a page fault every 4 KB
of every temporary. Measured with `controller.detect.queues.estimate_queues` on a window of
a 1,024-NIC fabric (962,034 delays): 120 ms a call with glibc's defaults, 96 ms with the
settings below; `qpmesh sim ingest --nics 1024 --seconds 20` 0.88 -> 0.99 M records/s on
the same code, its peak RSS unchanged (docs/benchmarks.md, "Controller ingest over 1 M
again").

`keep_freed_blocks` sets a fixed mmap threshold of 32 MiB (the most glibc raises it to on its
own on 64-bit: larger blocks, the 100,000-NIC solver's, still come from ``mmap`` and go back
when freed) and a trim threshold of 64 MiB (at most that much freed memory is held at the
heap's top, so a process's peak resident size can grow by that much; on the call above 64
MiB was as fast as 256 MiB, 32 MiB slower). ``malloc_trim`` (`testbed.sim.heap`, which the
scale benchmarks call between phases) still gives back every free page. Both are glibc
``mallopt`` settings; on another C library, or where the operator set the allocator's own
environment (``MALLOC_*_``, ``GLIBC_TUNABLES``) or ``QPMESH_HEAP=default``, nothing is changed."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
_OPERATOR = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)


def operator_chose(env: Mapping[str, str]) -> bool:
    """Return True where ``env`` already says how the allocator should behave (its own
    variables, glibc tunables for malloc, or ``QPMESH_HEAP=default``)."""
    return (
        env.get("QPMESH_HEAP") == "default"
        or any(k in env for k in _OPERATOR)
        or "glibc.malloc" in env.get("GLIBC_TUNABLES", "")
    )


def keep_freed_blocks(env: Mapping[str, str] | None = None) -> bool:
    """Set glibc's mmap and trim thresholds (the module docstring) unless the operator chose
    (`operator_chose` on ``env``, default the process's environment); return whether they
    were set (False also where the C library has no ``mallopt``). Never raises."""
    if operator_chose(os.environ if env is None else env):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
