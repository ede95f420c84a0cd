"""Files written whole or not at all: a run's JSON and YAML records, its report page, its W&B id.

A file is written under a temporary name beside its place (`.tmp-NAME-PID`), synced, then renamed
over it, so a reader (a resume, a browser, `streamrl report` in another process) sees the old version
or the new one, never a torn file. The temporary files of writers killed mid-write are removed by the
next write; those of writers still running are left to them.
"""

from __future__ import annotations

import os
from pathlib import Path

from streamrl.processes import pid_alive


def write_text_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all (see the module docstring)."""
    prefix = f".tmp-{path.name}-"
    for leftover in path.parent.glob(f"{prefix}*"):
        pid = leftover.name[len(prefix) :]
        if not (pid.isdigit() and pid_alive(int(pid))):  # its writer was killed mid-write
            leftover.unlink(missing_ok=True)
    tmp = path.parent / f"{prefix}{os.getpid()}"
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        sync_dir(path.parent)  # the new name is durable too
    finally:
        tmp.unlink(missing_ok=True)


def sync_dir(d: Path) -> None:
    """fsync a directory, so the names created or renamed in it survive a power cut."""
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
