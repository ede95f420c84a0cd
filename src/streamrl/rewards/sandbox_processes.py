"""How a sandboxed run's processes start and end (rewards/sandbox.py runs them): the first process dies
with the thread that started it (setpriv --pdeathsig, else a preexec_fn's prctl), and a run is ended by
its supervisor (the rlimits level) and then by its process group."""

from __future__ import annotations

import ctypes
import functools
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable

from streamrl.rewards.sandbox_probe import Isolation

SETUP_FAILED = 97  # the bootstrap's exit code when isolation could not be set up
_PR_SET_PDEATHSIG = 1
_SBIN = "/usr/bin:/bin:/usr/sbin:/sbin"


@functools.cache
def setpriv_prefix() -> tuple[str, ...]:
    """`setpriv --pdeathsig KILL --` when this machine's setpriv has the option (util-linux >= 2.33):
    the command in front of `unshare` that makes it die with the thread that started it. Starting it
    costs a few milliseconds whatever the caller's size, where a fork (preexec_fn, the fallback)
    copies the caller's page tables: a tenth of a second for a few GB of memory."""
    exe, true = shutil.which("setpriv", path=_SBIN), shutil.which("true", path=_SBIN)
    if exe is None or true is None:
        return ()
    try:
        r = subprocess.run([exe, "--pdeathsig", "KILL", "--", true], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (exe, "--pdeathsig", "KILL", "--") if r.returncode == 0 else ()


@functools.cache
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def die_with_caller(libc: ctypes.CDLL, caller: int) -> None:
    """preexec_fn of the fallback without setpriv: runs in the child between fork and exec (a system
    call and getppid, nothing that takes a lock), so that it gets SIGKILL when the thread that started
    it exits, and exits at once when the caller died before that was set."""
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != caller:
        os._exit(SETUP_FAILED)


def launcher(iso: Isolation) -> tuple[tuple[str, ...], Callable[[], None] | None]:
    """(argv in front of the level's prefix, preexec_fn) that make the sandbox's first process die with
    this process. The namespace levels start `unshare`, which cannot set it itself; its child (the
    bootstrap, the namespace's init) dies with it (--kill-child), and the namespace with its init. At
    the rlimits level the first process is the bootstrap, which sets it itself (_sandbox_boot)."""
    if not iso.prefix:
        return (), None
    if setpriv := setpriv_prefix():
        return setpriv, None
    return (), functools.partial(die_with_caller, libc(), os.getpid())


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the session leader's pgid = its pid (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def end_run(proc: subprocess.Popen[bytes], supervised: bool) -> None:
    """Kill what is left of a run: its whole process group. supervised (the rlimits level): first ask
    the bootstrap's supervisor (SIGTERM), which kills every process below it, even one that left the
    group with setsid; the group kill follows for a supervisor that is gone or does not answer."""
    if supervised and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc)


def read_capped(proc: subprocess.Popen[bytes], deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Drain stdout/stderr until EOF, the deadline or `cap` bytes in total -> (out, err, why_stopped)."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    sel = selectors.DefaultSelector()
    for f in bufs:
        sel.register(f, selectors.EVENT_READ)
    why = None
    try:
        while sel.get_map() and why is None:
            left = deadline - time.monotonic()
            if left <= 0:
                why = "timeout"
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                bufs[key.fileobj] += chunk  # type: ignore[index]
                if sum(map(len, bufs.values())) > cap:
                    why = "output_limit"
                    break
    finally:
        sel.close()
    return bytes(bufs[proc.stdout])[:cap], bytes(bufs[proc.stderr])[:cap], why
