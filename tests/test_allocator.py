"""trainer/allocator.py: after keep_freed_memory, freed blocks are reused without new page faults."""

from __future__ import annotations

import resource
import sys

import pytest
import torch

from streamrl.trainer.allocator import keep_freed_memory

MIB = 1 << 20


def _touch_and_free() -> int:
    """Allocate and write 8 blocks of 8 MiB (a step's activations in small), free them -> minor faults."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.ones(8 * MIB, dtype=torch.uint8) for _ in range(8)]
    del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_page_faults() -> None:
    assert keep_freed_memory() is True
    _touch_and_free()  # the heap grows once
    # 64 MiB freshly mapped would fault in 16384 pages of 4 KiB; reused pages fault none
    assert _touch_and_free() < 200
