"""The local sandbox's working directories, named after the process that made them, so that those a
killed process left behind are told apart from a live run's and removed by the next sandbox.

A run removes its directory itself on every path it controls (`LocalSandbox.run` returning or raising,
the interpreter exiting with runs still under way in daemon threads). A process killed mid-run (a
reward worker SIGKILLed at its timeout, a `kill -9` of the training run) cannot: its directory stays,
and `remove_stale` (called when a LocalSandbox is built) removes it later.

Name: streamrl-sbx-<host>-<pid>-<start>-<random>, in the temporary directory. host is 8 hex digits of
this boot (boot_id) and PID namespace (its inode): within them a pid and a start time (clock ticks
after boot, /proc/<pid>/stat) name one process only, and a later process reusing the pid has another
start time. A directory is stale when its host is this one, this user owns it, and no process with
its pid and start time exists. Directories of another boot, PID namespace (a container sharing /tmp),
user, or named otherwise (older versions) are never touched. Without a /proc of this process's own PID
namespace the directories are named streamrl-sbx-<random> and never removed by another process.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import tempfile

PREFIX = "streamrl-sbx-"


@functools.cache
def host_tag() -> str | None:
    """8 hex digits for this boot and PID namespace; None when /proc does not tell them."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        ns = os.stat("/proc/self/ns/pid")
    except OSError:
        return None
    return hashlib.blake2b(f"{boot}:{ns.st_dev}:{ns.st_ino}".encode(), digest_size=4).hexdigest()


def start_time(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks after boot), None when there is no such process.
    Raises OSError when /proc does not say (another user's process on a hidepid mount)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[19])  # field 22 of proc(5); fields[0] is field 3


def owner() -> str | None:
    """<host>-<pid>-<start> of this process, None when /proc cannot prove it later."""
    tag = host_tag()
    try:
        if tag is None or int(os.readlink("/proc/self")) != os.getpid():  # /proc of another namespace
            return None
        start = start_time(os.getpid())
    except (OSError, ValueError):
        return None
    return None if start is None else f"{tag}-{os.getpid()}-{start}"


def make_workdir() -> str:
    """A fresh directory for one run, in the temporary directory, named after this process."""
    who = owner()
    return tempfile.mkdtemp(prefix=PREFIX if who is None else f"{PREFIX}{who}-")


def _stale(name: str, tag: str) -> bool:
    parts = name[len(PREFIX) :].split("-")
    if len(parts) != 4 or parts[0] != tag or not (parts[1].isdigit() and parts[2].isdigit()):
        return False
    try:
        return start_time(int(parts[1])) != int(parts[2])
    except (OSError, ValueError, IndexError):  # /proc would not say: it may be alive
        return False


def remove_stale(tmp: str | None = None) -> int:
    """Remove the workdirs in `tmp` (default: the temporary directory) whose process no longer exists
    (see the module docstring); returns how many."""
    tag = host_tag()
    if tag is None:
        return 0
    removed, uid = 0, os.geteuid()
    try:
        entries = list(os.scandir(tmp or tempfile.gettempdir()))
    except OSError:
        return 0
    for e in entries:
        if not e.name.startswith(PREFIX) or not _stale(e.name, tag):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            shutil.rmtree(e.path, ignore_errors=True)
            removed += 1
    return removed
