"""Files written whole or not at all: a run's JSON and YAML records, its report page, its W&B id; the
lock a training process holds on its run directory; and the lock under which the processes that add
records to one JSON file (eval.json: the run and `streamrl eval`) each read, merge and write it.

A file is written under a temporary name beside its place (`.tmp-NAME-PID`), synced, then renamed
over it, so a reader (a resume, a browser, `streamrl report` in another process) sees the old version
or the new one, never a torn file. The temporary files of writers killed mid-write are removed by the
next write; those of writers still running are left to them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from streamrl.processes import pid_alive

log = logging.getLogger(__name__)

TEMP = ".tmp-"  # a file or directory being written is named TEMP + its final name + "-" + the writer's pid


def temp_path(final: Path) -> Path:
    """Where this process writes `final` before renaming it into place: `.tmp-NAME-PID` beside it."""
    return final.parent / f"{TEMP}{final.name}-{os.getpid()}"


def dead_writers_temp(name: str, of: str) -> bool:
    """Is `name` the temporary file of `of` (.tmp-OF-PID) whose writer was killed mid-write?"""
    prefix = f"{TEMP}{of}-"
    pid = name[len(prefix) :]
    return name.startswith(prefix) and not (pid.isdigit() and pid_alive(int(pid)))


def write_text_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all (see the module docstring)."""
    for leftover in path.parent.glob(f"{TEMP}{path.name}-*"):
        if dead_writers_temp(leftover.name, path.name):
            leftover.unlink(missing_ok=True)
    tmp = temp_path(path)
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


def file_digest(path: Path) -> str:
    """The file's sha256 in hex ("" if there is none): whether a file changed between two moments."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


MOVED_ASIDE = ".old-"  # a directory a durable write moved aside mid-swap (loop/durable.py), until recovered
RUN_LOCK = ".lock"  # in a run directory: flock'ed by the process training into it; the kernel lets go at exit


def run_dir_in_use(run_dir: Path) -> bool:
    """Does another process hold `run_dir`'s lock (a run training into it, or still saving)?"""
    lock = run_dir / RUN_LOCK
    if not lock.is_file():
        return False
    with lock.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # a filesystem without flock (Lustre without -o flock, some NFS): cannot tell
            return False
    return False


def in_use_message(run_dir: Path) -> str:
    return (
        f"run_dir {run_dir} is in use by another streamrl process (it trains or saves into it): wait for "
        "it to stop, or stop it (Ctrl-C saves its state), then resume"
    )


@contextlib.contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir`'s lock while the block runs (a second process training into it is refused)."""
    with (run_dir / RUN_LOCK).open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(in_use_message(run_dir)) from None
        except OSError as e:  # a filesystem without flock: train unlocked, and say so
            log.warning(
                "run_dir %s cannot be locked (%s): a second process training into it is not refused",
                run_dir,
                e,
            )
        yield


@contextlib.contextmanager
def _update_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on `path`'s sibling `.NAME.lock` while the block runs (not RUN_LOCK, which
    the training process holds for its lifetime); the kernel lets go when the file closes."""
    with (path.parent / f".{path.name}.lock").open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError as e:  # a filesystem without flock: update unlocked, and say so
            log.warning("%s cannot be locked (%s): a concurrent writer may drop a record", path, e)
        yield


def update_json(path: Path, merge: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """Write merge(the JSON object in `path`, {} when there is none) to `path` whole, read, merged and
    written under `path`'s update lock, so two processes updating it both keep their records; returns
    what was written."""
    with _update_lock(path):
        old = json.loads(path.read_text()) if path.is_file() else {}
        new = merge(old)
        write_text_atomic(path, json.dumps(new, indent=2))
    return new
