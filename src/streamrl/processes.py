"""Whether a process still runs, by its pid: the writers of leftovers (temporary files, shared-memory
segments, core locks) are told apart from live ones by it."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Is process `pid` running? Another user's process counts as running; a pid no process can have
    (out of range) does not."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (ProcessLookupError, OverflowError):
        return False
    return True
