"""Keep the trainer's freed memory mapped: no page faults for each step's activations (glibc, CPU).

PyTorch's CPU allocator is malloc. glibc serves large blocks with their own mmap and unmaps them on
free, and trims the heap's free top back to the OS, so every step's activations (GBs for SmolLM2)
arrive in freshly mapped pages that the kernel faults in and zeroes one 4 KiB page at a time: about
0.4-0.5 M minor faults per SmolLM2 step on the default job's batch, seconds of system time.
`keep_freed_memory` raises both thresholds: blocks up to `limit` bytes come from the heap and freed
memory stays in the process for the next step (its resident size stays at the step's high-water mark,
which the step needs anyway).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
MAX_INT = 2**31 - 1  # mallopt takes an int


def keep_freed_memory(limit: int = 1 << 30) -> bool:
    """Serve allocations up to `limit` bytes from the heap and never trim it; -> whether applied (False
    off Linux or without glibc's mallopt, e.g. musl)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    # glibc before 2.35 refuses mmap thresholds over 32 MiB: then blocks above that stay mmap'd
    mapped = mallopt(M_MMAP_THRESHOLD, min(limit, MAX_INT)) or mallopt(M_MMAP_THRESHOLD, 32 << 20)
    return bool(mapped) and bool(mallopt(M_TRIM_THRESHOLD, MAX_INT))
