"""processes.parent_gone: a worker started through multiprocessing's fork server sees its trainer end by
either sign, the parent sentinel reaching end-of-file or the trainer's pid no longer running (a process
that inherited the trainer's end of the pipe keeps the sentinel open)."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys

import pytest

from streamrl.processes import parent_gone, pid_alive


class _Parent:
    """What multiprocessing.parent_process() returns in a child: a pid and a sentinel check."""

    def __init__(self, pid: int, alive: bool) -> None:
        self.pid, self.alive = pid, alive

    def is_alive(self) -> bool:
        return self.alive


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The pid of a process that has ended and was reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not pid_alive(child.pid)
    return child.pid


@pytest.mark.parametrize(
    ("sentinel_open", "pid_running", "gone"),
    [
        (True, True, False),  # the trainer runs
        (True, False, True),  # its pid is gone, though another process holds its end of the pipe
        (False, True, True),  # the sentinel reached end-of-file (its pid already taken again, say)
        (False, False, True),
    ],
)
def test_the_trainer_is_gone_by_its_sentinel_or_by_its_pid(
    monkeypatch, dead_pid, sentinel_open, pid_running, gone
) -> None:
    parent = _Parent(os.getpid() if pid_running else dead_pid, sentinel_open)
    monkeypatch.setattr(mp, "parent_process", lambda: parent)
    check = parent_gone()
    assert check() is gone
    parent.alive = False  # the check follows the sentinel after it was made
    assert check() is True


def test_a_process_not_started_by_multiprocessing_watches_its_parent_pid(monkeypatch) -> None:
    monkeypatch.setattr(mp, "parent_process", lambda: None)
    ppid = [os.getppid()]
    monkeypatch.setattr(os, "getppid", lambda: ppid[0])
    check = parent_gone()
    assert check() is False
    ppid[0] = 1  # re-parented to init: the parent ended
    assert check() is True


def test_pid_alive_tells_running_ended_and_impossible_pids_apart(dead_pid) -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(dead_pid)
    assert not pid_alive(2**40)  # no process can have it
