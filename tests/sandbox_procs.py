"""The processes of the sandboxes a test starts, found from /proc by their workdir (tests/ is on
sys.path): a test gives its sandboxes a directory of its own (the conftest fixture sandbox_root), so
that what it finds is its own, not a sandbox another test runs beside it (pytest -n)."""

from __future__ import annotations

import os
from pathlib import Path


def sandboxed(root: str) -> list[int]:
    """Processes of a sandbox whose workdir is under root (`unshare` and the bootstrap: their argv
    holds it; the program is a fork of the bootstrap)."""
    found, mark = [], f"{root}/streamrl-sbx-".encode()
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and mark in Path(f"/proc/{d}/cmdline").read_bytes():
                found.append(int(d))
        except OSError:
            pass
    return found
