"""Named semaphores and lock files a killed run leaves behind, and their removal by the next run.

multiprocessing's queues and values (spawn start method) are backed by named POSIX semaphores that
its resource tracker unlinks when the run exits; a kill -9 of the run's process group takes the tracker
with it and the names stay in /dev/shm. Each run names its semaphores after its pid, so a later run can
prove a leftover's owner dead and remove it. The elastic cores' lock files (placement/shared_lock.py,
in the temporary directory) are named the same way. Normal exits, Ctrl-C and SIGTERM release
everything as before.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from pathlib import Path

from streamrl.processes import pid_alive

PREFIX = "mp-streamrl-"
SHM = Path("/dev/shm")
LOCK_PREFIX = "streamrl-lock-"  # + <pid>-<random>, in the temporary directory


def name_semaphores_after_this_process() -> None:
    """Semaphores created from now on are /dev/shm/sem.mp-streamrl-<pid>-<random>."""
    multiprocessing.current_process()._config["semprefix"] = f"/{PREFIX}{os.getpid()}"


def remove_leftovers(shm: Path = SHM, tmp: Path | None = None) -> int:
    """Unlink the semaphores and lock files of streamrl runs whose process no longer exists; returns
    how many."""
    removed = 0
    tmp = Path(tempfile.gettempdir()) if tmp is None else tmp
    for folder, prefix in ((shm, f"sem.{PREFIX}"), (tmp, LOCK_PREFIX), (shm, LOCK_PREFIX)):
        for f in folder.glob(f"{prefix}*"):
            pid = f.name[len(prefix) :].split("-")[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                f.unlink(missing_ok=True)
                removed += 1
    return removed
