"""A lock shared by processes that the kernel frees when its holder dies.

`flock` on a small file: a process killed inside the lock (SIGKILL lands anywhere) releases it with its
file, so no survivor waits for it and none has to guess that its holder is gone. A threading lock in
front excludes the threads of one process, which `flock` does not (they share the file). Picklable to
spawned processes: each process (a fork included) opens the file itself, since a lock taken through a
file description inherited from another process would be that process's lock too.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import weakref
from typing import Any

from streamrl.placement.leftovers import LOCK_PREFIX


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


_OPENING = threading.Lock()  # a process's first use opens the file once, whichever thread comes first


class SharedLock:
    """acquire() / release() across processes and threads; `with lock:` takes it."""

    def __init__(self) -> None:
        self.path = ""
        for folder in (None, "/dev/shm"):  # TMPDIR, or tmpfs where TMPDIR's filesystem has no flock
            # named after this process: a later run removes the file if this one is killed (leftovers.py)
            fd, path = tempfile.mkstemp(prefix=f"{LOCK_PREFIX}{os.getpid()}-", dir=folder)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                self.path = path
                break
            except OSError:
                _unlink(path)
            finally:
                os.close(fd)
        if not self.path:
            raise OSError("no filesystem for the elastic cores' lock supports flock (TMPDIR, /dev/shm)")
        self._pid = 0
        weakref.finalize(self, _unlink, self.path)  # the creator's copy removes the file

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self._pid = state["path"], 0

    def _open(self) -> None:
        if self._pid != os.getpid():  # first use in this process
            with _OPENING:
                if self._pid != os.getpid():
                    self._fd = os.open(self.path, os.O_RDWR)
                    self._threads = threading.Lock()
                    weakref.finalize(self, os.close, self._fd)  # this process's copy closes its file
                    self._pid = os.getpid()

    def acquire(self) -> None:
        self._open()
        self._threads.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def __enter__(self) -> SharedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
