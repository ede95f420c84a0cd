"""Named semaphores a killed run leaves in /dev/shm, and their removal by the next run.

multiprocessing's queues and values (spawn start method) are backed by named POSIX semaphores that
its resource tracker unlinks when the run exits; a kill -9 of the run's process group takes the tracker
with it and the names stay in /dev/shm. Each run names its semaphores after its pid, so a later run can
prove a leftover's owner dead and remove it. Normal exits, Ctrl-C and SIGTERM release everything as
before.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from streamrl.processes import pid_alive

PREFIX = "mp-streamrl-"
SHM = Path("/dev/shm")


def name_semaphores_after_this_process() -> None:
    """Semaphores created from now on are /dev/shm/sem.mp-streamrl-<pid>-<random>."""
    multiprocessing.current_process()._config["semprefix"] = f"/{PREFIX}{os.getpid()}"


def remove_leftovers(shm: Path = SHM) -> int:
    """Unlink the semaphores of streamrl runs whose process no longer exists; returns how many."""
    removed = 0
    for f in shm.glob(f"sem.{PREFIX}*"):
        pid = f.name[len(f"sem.{PREFIX}") :].split("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            f.unlink(missing_ok=True)
            removed += 1
    return removed
