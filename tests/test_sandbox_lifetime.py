"""The sandbox's processes do not outlive the process that started them, nor their wall-time limit when
that process no longer watches them: at every isolation level this machine offers, and for the
namespace levels with both ways of arming the parent-death signal (setpriv, the preexec fallback).
Their directories go too: removed by the run, at interpreter exit, or (the caller was killed) by the
next sandbox built, which never touches a live process's directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from bounded import eventually
from reward_scorers import SandboxSleep
from sandbox_levels import LEVELS, level_works
from sandbox_procs import sandboxed

from streamrl.rewards.sandbox import Limits, LocalSandbox
from streamrl.rewards.sandbox_workdirs import PREFIX, host_tag, make_workdir, start_time
from streamrl.rewards.service import RewardService

# the program sleeps, and so does a child it forked that left its process group and session
SLEEPERS = "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(60)\n"
# the caller: a Python process running SLEEPERS sandboxed; prints "started" once its sandbox is built.
# how="thread": the run is in a daemon thread and the interpreter exits when a line comes on stdin
CALLER = """
import sys, tempfile, threading
tempfile.tempdir = sys.argv[1]
from streamrl.rewards import sandbox_processes
from streamrl.rewards.sandbox import Limits, LocalSandbox
level, launcher, wall_s, how, program = sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5], sys.argv[6]
if launcher == "preexec":
    sandbox_processes.setpriv_prefix = lambda: ()  # as on a machine without setpriv --pdeathsig
box = LocalSandbox(isolation=level, min_isolation="rlimits")
print("started", flush=True)
def run():
    r = box.run(program, "", Limits(wall_s=wall_s))
    print(r.status, flush=True)
if how == "thread":
    threading.Thread(target=run, daemon=True).start()
    sys.stdin.readline()
else:
    run()
"""
# (level, launcher): the rlimits level's first process is the bootstrap itself, which needs neither
CASES = [(level, launcher) for level in LEVELS[:2] for launcher in ("setpriv", "preexec")] + [
    ("rlimits", "self")
]


def _skip_unless_available(level: str) -> None:
    if not level_works(level):
        pytest.skip(f"{level} cannot run on this machine")


def _poll(until: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    """bounded.eventually, reading /proc at most 20 times a second."""
    return eventually(until, timeout_s, poll_s=0.05)


def _start(root: str, level: str, launcher: str, wall_s: float, how: str = "main") -> subprocess.Popen[bytes]:
    """A caller whose sandboxed program runs with its child: besides them, `unshare` and init at the
    namespace levels, the supervisor at the rlimits level."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CALLER, root, level, launcher, str(wall_s), how, SLEEPERS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    running = 3 if level == "rlimits" else 4
    assert _poll(lambda: len(sandboxed(root)) >= running, 60.0), "the sandboxed program never started"
    return proc


@pytest.mark.parametrize(("level", "launcher"), CASES)
def test_the_program_dies_with_its_caller(
    sandbox_root: str, level: str, launcher: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _skip_unless_available(level)
    proc = _start(sandbox_root, level, launcher, wall_s=120.0)  # the wall-time limit is far away
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert _poll(lambda: not sandboxed(sandbox_root)), f"still running: {sandboxed(sandbox_root)}"
    # its workdir, which the killed caller could not remove, goes when the next sandbox is built
    monkeypatch.setattr(tempfile, "tempdir", sandbox_root)
    LocalSandbox(isolation="rlimits", min_isolation="rlimits")
    assert os.listdir(sandbox_root) == []


@pytest.mark.parametrize("level", LEVELS)
def test_the_program_ends_at_its_wall_limit_when_its_caller_no_longer_watches(
    sandbox_root: str, level: str
) -> None:
    """The caller is stopped (SIGSTOP): alive, so no parent-death signal, but its watchdog is gone."""
    _skip_unless_available(level)
    proc = _start(sandbox_root, level, "setpriv", wall_s=2.0)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        assert _poll(lambda: not sandboxed(sandbox_root)), f"still running: {sandboxed(sandbox_root)}"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, b"timeout\n")
    assert os.listdir(sandbox_root) == []


@pytest.mark.parametrize("level", LEVELS)
def test_a_reward_worker_killed_at_its_timeout_takes_its_sandbox_with_it(
    sandbox_root: str, level: str
) -> None:
    """reward.service=process: the worker running the sandbox is SIGKILLed at reward.timeout_s; the
    program goes with it, and the worker that replaces it removes the workdir when it sets up."""
    _skip_unless_available(level)
    scorer = SandboxSleep(level, sandbox_root)
    with RewardService(scorer, workers=1, timeout_s=3.0, mode="process", cache_size=0) as svc:
        fut = svc.submit(60.0)
        running = 3 if level == "rlimits" else 4
        assert _poll(lambda: len(sandboxed(sandbox_root)) >= running, 60.0), (
            "the sandboxed program never started"
        )
        assert fut.result(timeout=60).error == "timeout"
        assert _poll(lambda: not sandboxed(sandbox_root)), f"still running: {sandboxed(sandbox_root)}"
        assert _poll(lambda: os.listdir(sandbox_root) == [], 60.0), f"left behind: {os.listdir(sandbox_root)}"


@pytest.mark.parametrize("level", LEVELS)
def test_a_run_in_a_daemon_thread_ends_with_the_interpreter(sandbox_root: str, level: str) -> None:
    """The interpreter exits while a daemon thread is mid-run (a scoring service closed without
    waiting): the program dies and its directory is removed, with no later sandbox to clean up."""
    _skip_unless_available(level)
    proc = _start(sandbox_root, level, "setpriv", wall_s=120.0, how="thread")
    proc.communicate(b"exit\n", timeout=60)
    assert proc.returncode == 0
    assert _poll(lambda: not sandboxed(sandbox_root)), f"still running: {sandboxed(sandbox_root)}"
    assert os.listdir(sandbox_root) == []


def test_only_the_workdirs_of_processes_that_are_gone_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = host_tag()
    if tag is None:
        pytest.skip("no /proc: workdirs are not named after their process")
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    gone, live = subprocess.Popen(sleep), subprocess.Popen(sleep)
    try:
        gone_start, live_start = start_time(gone.pid), start_time(live.pid)
        gone.kill()
        gone.wait()
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        other = "00000000" if tag != "00000000" else "11111111"
        names = {
            "gone": f"{PREFIX}{tag}-{gone.pid}-{gone_start}-aaaaaaaa",
            "pid reused": f"{PREFIX}{tag}-{live.pid}-{live_start + 1}-bbbbbbbb",  # another process, gone
            "live": f"{PREFIX}{tag}-{live.pid}-{live_start}-cccccccc",
            "another boot or PID namespace": f"{PREFIX}{other}-{gone.pid}-{gone_start}-dddddddd",
            "an older version's": f"{PREFIX}eeeeeeee",
        }
        for name in names.values():
            (tmp_path / name).mkdir()
        (tmp_path / names["gone"] / "program.py").write_text("print(1)\n")
        not_a_dir = tmp_path / f"{PREFIX}{tag}-{gone.pid}-{gone_start}-ffffffff"
        not_a_dir.write_text("")
        mine = Path(make_workdir())  # this process's: alive
        another_user = tmp_path / f"{PREFIX}{tag}-{gone.pid}-{gone_start}-gggggggg"
        if os.geteuid() == 0:
            another_user.mkdir()
            os.chown(another_user, 54321, 54321)
        LocalSandbox(isolation="rlimits", min_isolation="rlimits")
        kept = {p.name for p in tmp_path.iterdir()}
        assert {k for k, name in names.items() if name in kept} == {
            "live",
            "another boot or PID namespace",
            "an older version's",
        }
        assert {mine.name, not_a_dir.name} <= kept
        assert another_user.exists() == (os.geteuid() == 0)
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize("level", LEVELS)
def test_a_child_that_left_the_process_group_ends_with_the_program(
    sandbox_root: str, level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _skip_unless_available(level)
    monkeypatch.setattr(tempfile, "tempdir", sandbox_root)
    box = LocalSandbox(isolation=level, min_isolation="rlimits")
    prog = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')\n"
    r = box.run(prog, "", Limits(wall_s=30.0))
    assert (r.status, r.exit_code, r.stdout) == ("ok", 0, "parent done\n")
    assert _poll(lambda: not sandboxed(sandbox_root)), f"still running: {sandboxed(sandbox_root)}"


@pytest.mark.parametrize("level", LEVELS)
def test_a_child_that_left_the_process_group_ends_at_the_wall_limit(
    sandbox_root: str, level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _skip_unless_available(level)
    monkeypatch.setattr(tempfile, "tempdir", sandbox_root)
    r = LocalSandbox(isolation=level, min_isolation="rlimits").run(SLEEPERS, "", Limits(wall_s=2.0))
    assert (r.status, r.exit_code) == ("timeout", None)
    assert _poll(lambda: not sandboxed(sandbox_root)), f"still running: {sandboxed(sandbox_root)}"
