"""Whether a process still runs, by its pid: the writers of leftovers (temporary files, shared-memory
segments, core locks) are told apart from live ones by it. And whether the process that started this
one still runs (a worker must not outlive its run)."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable


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


def parent_gone() -> Callable[[], bool]:
    """A check, cheap enough for every decode step, that turns true once the process that started this
    one has ended (killed with SIGKILL included). For a child of multiprocessing's fork server that is
    the process that asked for it, not the server: getppid names the server, which lives on while its
    children hold its pipe. Such a child's `parent_process()` sentinel reaches end-of-file when the
    requester exits; its pid is checked too (a process that inherited the requester's end of that pipe
    keeps the sentinel open). A process not started by multiprocessing watches getppid."""
    parent = mp.parent_process()
    if parent is None or parent.pid is None:
        ppid = os.getppid()
        return lambda: os.getppid() != ppid
    pid = parent.pid
    return lambda: not parent.is_alive() or not pid_alive(pid)
