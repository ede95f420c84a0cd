"""trainer/allocator.py: after keep_freed_memory, freed blocks are reused without new page faults."""

from __future__ import annotations

import ctypes
import resource
import sys

import pytest

from streamrl.trainer.allocator import keep_freed_memory

MIB = 1 << 20
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


def _faults() -> int:
    """This thread's minor faults: another thread of the process (a library's, an earlier test's)
    faulting meanwhile is not counted."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _malloc_touch_free(libc: ctypes.CDLL, size: int) -> int:
    """malloc a block, write every byte, free it at once -> the minor faults that took."""
    before = _faults()
    p = libc.malloc(ctypes.c_size_t(size))
    assert p
    ctypes.memset(p, 1, size)
    libc.free(ctypes.c_void_p(p))
    return _faults() - before


@linux_only
def test_a_freed_block_stays_mapped_for_the_next_allocation() -> None:
    """By default glibc maps a 256 MiB block on its own (above its largest dynamic mmap threshold,
    32 MiB) and unmaps it on free, or, carved from the top of the heap, trims it back to the OS once
    freed: either way the same request again faults in 65536 fresh 4 KiB pages. With keep_freed_memory
    the block comes from the heap and stays there: after the first round, none of its pages faults again
    (the interpreter's own objects, allocated around the call, may fault a page or two)."""
    assert keep_freed_memory() is True
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    _malloc_touch_free(libc, 256 * MIB)  # fresh pages, unless an earlier test left such a block free
    faults = [_malloc_touch_free(libc, 256 * MIB) for _ in range(3)]
    assert all(f <= 4 for f in faults), faults  # a fresh block: 65536
