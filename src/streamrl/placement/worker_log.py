"""A rollout worker's stderr log, RUN_DIR/rollout-worker<i>.log, as both backends keep it.

The trainer's process creates the file; each process of that worker (a restart, a resumed run) appends
to it, after a line naming its start, by pointing its file descriptor 2 at the file. The descriptor,
not only `sys.stderr`: logging handlers made before the switch (they hold the old `sys.stderr`
object, whose descriptor is 2), Python's last-resort handler (the reward service's first-failure
warning, say), tracebacks and C extensions all write there.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path


def log_path(run_dir: Path, index: int) -> Path:
    """Where rollout worker `index` of the run in `run_dir` keeps its stderr."""
    return run_dir / f"rollout-worker{index}.log"


_START = re.compile(rb"^--- \d{4}-\d\d-\d\d \d\d:\d\d:\d\d rollout worker \d+ .*starting$", re.MULTILINE)
TAIL_CHARS = 400  # how much of a dead worker's stderr its restart or failure message quotes


def start_line(index: int, incarnation: str = "") -> str:
    """The line a worker's log gets before the output of each process of that worker; a Ray actor's
    names its incarnation (a fresh id per start), so that its own output can be found again."""
    who = f" ({incarnation})" if incarnation else ""
    return f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} rollout worker {index}{who} starting\n"


def tail(log: Path, start: int = 0, n: int = TAIL_CHARS) -> str:
    """The last n characters one process wrote to its log from byte `start` on, quoted; "(nothing)"
    when it wrote nothing, "(no log)" when the log cannot be read."""
    try:
        with log.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(start, size - 4 * n))
            text = f.read().decode(errors="replace").strip()
    except OSError:
        return "(no log)"
    return repr(text[-n:]) if text else "(nothing)"


def incarnation_tail(log: Path, incarnation: str, n: int = TAIL_CHARS) -> str:
    """What the process of a Ray actor's `incarnation` wrote last to its log, up to the next process's
    start line (its restart may already have begun writing): quoted, "(nothing)", or "(no log)" when
    the log cannot be read or holds no start line of that incarnation (its node does not see the run
    directory, or it died before writing one)."""
    try:
        data = log.read_bytes() if incarnation else b""
    except OSError:
        return "(no log)"
    start = data.rfind(f" ({incarnation}) starting\n".encode())
    if start < 0:
        return "(no log)"
    body = data[data.index(b"\n", start) + 1 :]
    following = _START.search(body)  # the next process's start line, if it has written one
    text = body[: following.start() if following else len(body)].decode(errors="replace").strip()
    return repr(text[-n:]) if text else "(nothing)"


def stderr_to(fd: int) -> None:
    """This process's stderr (descriptor 2 and `sys.stderr`, line-buffered) from now on goes to `fd`,
    a file opened for appending; `fd` itself is closed."""
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def keep_stderr(run_dir: str, index: int, incarnation: str = "") -> Path | None:
    """In a Ray actor: its stderr from now on appended to the run's rollout-worker<index>.log, after a
    start line naming its incarnation; -> the log, or None when the log cannot be opened (no run
    directory, or one the actor's node does not see).

    The file is opened only if it exists (without O_CREAT): the trainer's process created it, so an
    actor that can open it shares the trainer's filesystem (a single-node Ray, or a run directory on a
    filesystem every node mounts at the same path). On a multi-node cluster without one, an actor on
    another node finds no file and keeps Ray's own handling of its stderr: the worker's file in that
    node's Ray session logs (under its RAY_TMPDIR), also printed on the driver's console with a
    `(RolloutActor pid=...)` prefix; nothing is written on that node. (A node that happens to hold a
    file at the same path, an older run's, gets this actor's lines appended there.)"""
    if not run_dir:
        return None
    log = log_path(Path(run_dir), index)
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return None
    os.write(fd, start_line(index, incarnation).encode())
    stderr_to(fd)
    return log


def create_logs(run_dir: str, n: int) -> list[Path]:
    """The trainer's side: the logs of workers 0..n-1, created if missing (kept if present), in the run
    directory; none without one."""
    if not run_dir or not Path(run_dir).is_dir():
        return []
    logs = [log_path(Path(run_dir), i) for i in range(n)]
    for log in logs:
        log.touch()
    return logs
