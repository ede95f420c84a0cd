"""Run untrusted Python programs for code rewards: a small Executor protocol, a registry, LocalSandbox.

`LocalSandbox.run(program, stdin, limits) -> ExecResult` runs `python -I` on the program in a fresh
temporary directory (its cwd, deleted afterwards; one a killed caller left behind is deleted by the next
LocalSandbox built, see sandbox_workdirs.py) with an empty environment (PATH, LANG, HOME=TMPDIR=
workdir only), in a new session whose whole process group is SIGKILLed at the wall-time limit, with
RLIMIT_CPU/AS/FSIZE/NPROC and RLIMIT_CORE=0, and stdout+stderr capped at `limits.output_bytes`.
The sandbox's processes die with the process that started them: the first one gets SIGKILL when the
caller's thread that started it exits (PR_SET_PDEATHSIG: `setpriv --pdeathsig` in front of `unshare`,
else set between fork and exec; the bootstrap sets it itself at the rlimits level), and each later one
dies with its own parent. The wall-time limit is enforced inside the sandbox as well (by the
bootstrap's init or supervisor, _sandbox_boot.py), so a program never outlives its limit even when its
caller is stopped or hangs.
On top of that it uses the strongest isolation level that works on this machine, probed once
(sandbox_probe.py), and refuses to run at all below `min_isolation` (reward.sandbox_min_isolation):

- "ns-root"  (running as root): `unshare --pid --fork --net --mount`; the bootstrap makes every mount
  read-only, mounts a size-capped tmpfs on the workdir, then drops to an unused unprivileged uid.
- "ns-user"  (not root; needs unprivileged user namespaces): the same inside `unshare --user
  --map-root-user`, then drops every capability so the program cannot remount anything writable.
- "rlimits"  (no namespaces): rlimits, an unused unprivileged uid when root, and a Python audit hook
  refusing sockets, starting other programs (subprocess, os.exec*/posix_spawn/system) and ctypes.

Protected at the namespace levels: network (an empty network namespace, for child processes too),
writes outside the workdir (read-only mounts; the workdir is a private tmpfs), fork bombs (RLIMIT_NPROC
counted inside the sandbox; the PID namespace dies with its init, so no process survives a kill, even
one that called setsid), CPU/memory/disk/output exhaustion, secrets in environment variables.
NOT protected: reading world-readable host files, kernel exploits (no seccomp filter), /proc and /sys
information, CPU contention with the host (no cgroup), side channels.
The "rlimits" level protects CPU/memory/file-size/output and the environment the same way; as root,
writes outside the workdir only land where any uid may write (/tmp, /dev/shm) and RLIMIT_NPROC counts
the run's own uid, so fork bombs are contained. Its network and process block is Python-level: it stops
a child opening its own socket by every ordinary route (a forked child keeps the hook), but code that
corrupts the interpreter's memory (e.g. through /proc/self/mem) can get past it. Not as root, the
program keeps the caller's uid (its files, its processes). There is no PID namespace: the bootstrap
stays the program's supervisor (a child subreaper) and kills every process below it, even one that
called setsid, when the program exits, at the wall limit or when the caller dies; not as root the
program may kill its supervisor first (same uid), which takes the program along but not the other
processes it started. For untrusted models on a shared cluster plug in a stronger Executor
(gVisor/nsjail/firejail/Docker runner, or a remote sandbox HTTP service) with `register_executor`.
See docs/sandbox.md.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from streamrl.brief import brief
from streamrl.rewards.sandbox_probe import (
    Isolation,
    Probe,
    SandboxIsolationError,
    candidates,
    check_minimum,
    detect,
)
from streamrl.rewards.sandbox_processes import SETUP_FAILED, end_run, launcher, read_capped
from streamrl.rewards.sandbox_workdirs import make_workdir, remove_stale

__all__ = [
    "EXECUTORS",
    "ExecResult",
    "Executor",
    "Isolation",
    "Limits",
    "LocalSandbox",
    "SandboxIsolationError",
    "get_executor",
    "probe_isolation",
    "register_executor",
]

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "killed"]
_BOOT = str(Path(__file__).with_name("_sandbox_boot.py"))
_WALL_MARK = "sandbox wall-clock limit reached"  # the bootstrap's last stderr line when it killed at wall_s
_UID_BASE = 200_000  # root host: each run gets its own unused uid, so RLIMIT_NPROC budgets are separate
_uid_counter = itertools.count()
# workdir -> (its first process, supervised: see end_run), while a run lasts
_running: dict[str, tuple[subprocess.Popen[bytes], bool] | None] = {}
_running_lock = threading.Lock()


@dataclass(frozen=True)
class Limits:
    """Per-run resource limits. cpu_s/wall_s in seconds; *_mb in MiB; output_bytes = stdout+stderr."""

    cpu_s: float = 2.0
    wall_s: float = 4.0
    memory_mb: int = 512  # address space (RLIMIT_AS): Python itself needs ~30 MiB
    file_size_mb: int = 16  # largest file the program may write; also the workdir tmpfs size
    max_processes: int = 16  # processes/threads inside the sandbox, the program included
    output_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_mb", "file_size_mb", "max_processes", "output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name} must be > 0, got {getattr(self, name)!r}")


@dataclass
class ExecResult:
    """What one run produced. exit_code is None when the sandbox killed it; wall_s includes setup."""

    stdout: str
    stderr: str
    exit_code: int | None
    status: Status
    wall_s: float
    isolation: str = ""  # the level it ran under ("ns-root", "ns-user", "rlimits", or another executor's)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def setup_failed(self) -> bool:
        """The sandbox could not isolate the program (a namespace, a mount, a limit refused by the host):
        it never ran, so its status says nothing of the program."""
        return _setup_failed(self.exit_code, self.stderr)


class Executor(Protocol):
    """Anything that can run a Python program on stdin and report what happened."""

    name: str

    def run(self, program: str, stdin: str = "", limits: Limits | None = None) -> ExecResult: ...


_PROBE = "import os\nprint(os.getpid(), os.statvfs('/').f_flag & os.ST_RDONLY)\n"


def _probe_level(iso: Isolation, python: str) -> str | None:
    """None when `iso` works here, else why not (one line). It works when the program is the first child
    of its PID namespace's init (pid 2, see _sandbox_boot) and sees / read-only."""
    r = _run(iso, python, _PROBE, "", Limits(wall_s=10.0))
    if r.status == "ok" and r.stdout.split() == ["2", "1"]:
        return None
    if r.status == "ok":
        return f"the probe printed {r.stdout.strip()!r}, expected '2 1' (pid 2, / read-only)"
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    return f"{r.status}: " + (brief(lines[-1]) if lines else f"exit code {r.exit_code}")


def probe_isolation(python: str = sys.executable) -> Probe:
    """The strongest level that works here and why the stronger ones failed (probed once per interpreter)."""
    return detect(python, _probe_level)


def _user_task_count(proc: str = "/proc") -> int:
    """This uid's threads, all processes' together: what RLIMIT_NPROC counts on Linux (a thread is a
    task like a process, so a trainer's or a reward function's threads take from the sandbox's budget)."""
    uid = os.getuid()
    n = 0
    for d in os.listdir(proc):
        try:
            if d.isdigit() and os.stat(f"{proc}/{d}").st_uid == uid:
                n += len(os.listdir(f"{proc}/{d}/task"))
        except OSError:  # it exited meanwhile
            pass
    return n


def _boot_config(iso: Isolation, workdir: str, limits: Limits) -> dict[str, object]:
    drop = "none"
    nproc = limits.max_processes
    if iso.drop == "uid":
        drop = f"uid:{_UID_BASE + (os.getpid() % 65536) * 64 + next(_uid_counter) % 64}"
    elif iso.drop == "caps":
        drop = "caps"
        nproc += 1  # the namespace's init (see _sandbox_boot) runs as the same user
    elif iso.name == "rlimits":  # same uid as the host: its other threads count against the limit too
        nproc += _user_task_count() + 1  # + the bootstrap's supervisor (see _sandbox_boot)
    return {
        "workdir": workdir,
        "fs": iso.fs,
        "drop": drop,
        "nproc": nproc,
        "tmpfs_mb": limits.file_size_mb,
        "audit_hook": iso.audit_hook,
        "cpu_s": limits.cpu_s,
        "memory_mb": limits.memory_mb,
        "file_size_mb": limits.file_size_mb,
        "wall_s": limits.wall_s,
        "parent": os.getpid(),
    }


def _wall_limit_hit(rc: int | None, stderr: str) -> bool:
    """The bootstrap killed the program at its wall-time limit (the caller had not yet)."""
    lines = stderr.rstrip().rsplit("\n", 1)
    return rc not in (None, 0) and lines[-1].startswith(_WALL_MARK)


def _setup_failed(rc: int | None, stderr: str) -> bool:
    return rc == SETUP_FAILED and stderr.startswith("sandbox setup failed")


def _status(rc: int | None, stopped: str | None, stderr: str) -> Status:
    if stopped is not None:
        return stopped  # type: ignore[return-value]
    if rc == 0:
        return "ok"
    if rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "timeout"  # CPU limit
    if "MemoryError" in stderr[-2000:] or "Cannot allocate memory" in stderr[-2000:]:
        return "memory"
    if rc is not None and (rc < 0 or rc > 128):
        return "killed"
    return "error"


def _end_runs_at_exit() -> None:
    """At interpreter exit, runs still under way (in daemon threads: a scoring service closed without
    waiting) are killed and their directories removed; the daemon threads never get to it."""
    with _running_lock:
        runs = list(_running.items())
    for workdir, run in runs:
        if run is not None:
            end_run(*run)
        shutil.rmtree(workdir, ignore_errors=True)


atexit.register(_end_runs_at_exit)


def _run(iso: Isolation, python: str, program: str, stdin: str, limits: Limits) -> ExecResult:
    t0 = time.monotonic()
    workdir = make_workdir()
    with _running_lock:
        _running[workdir] = None
    try:
        os.chmod(workdir, 0o777 if iso.fs == "none" else 0o755)  # fallback: the dropped uid writes here
        Path(workdir, "program.py").write_text(program, encoding="utf-8")
        cfg = json.dumps(_boot_config(iso, workdir, limits))
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        first, preexec = launcher(iso)
        with tempfile.TemporaryFile() as fin:
            fin.write(stdin.encode())
            fin.seek(0)
            # this thread waits for the process below before it returns: the parent-death signal (sent
            # when the starting thread exits) comes only when this whole process dies
            proc = subprocess.Popen(
                [*first, *iso.prefix, python, "-I", _BOOT, cfg],
                stdin=fin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=env,
                start_new_session=True,
                close_fds=True,
                preexec_fn=preexec,
            )
        supervised = not iso.prefix  # no namespace: the bootstrap supervises the program (_sandbox_boot)
        with _running_lock:
            _running[workdir] = (proc, supervised)
        try:
            out, err, stopped = read_capped(proc, t0 + limits.wall_s, limits.output_bytes)
            if stopped is None:
                try:
                    proc.wait(max(0.0, t0 + limits.wall_s - time.monotonic()))
                except subprocess.TimeoutExpired:
                    stopped = "timeout"
        finally:
            end_run(proc, supervised)  # also reaps leftovers: children still running after the program exited
            proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
        stderr = err.decode("utf-8", "replace")
        rc = None if stopped is not None else proc.returncode
        if _wall_limit_hit(rc, stderr):
            stopped, rc = "timeout", None
        status = "error" if _setup_failed(rc, stderr) else _status(rc, stopped, stderr)
        return ExecResult(out.decode("utf-8", "replace"), stderr, rc, status, time.monotonic() - t0, iso.name)
    finally:
        with _running_lock:
            _running.pop(workdir, None)
        shutil.rmtree(workdir, ignore_errors=True)


class LocalSandbox:
    """Processes on this machine, isolated as well as the machine allows (see the module docstring).

    isolation: None = probe for the strongest level; or force "ns-root" / "ns-user" / "rlimits".
    min_isolation: "auto" / "namespaces" / "rlimits" (sandbox_probe.py). The level is found and checked
    here, so a sandbox below the minimum raises SandboxIsolationError before it runs any program.
    Building one removes the workdirs that killed processes left in the temporary directory
    (sandbox_workdirs.remove_stale).
    """

    name = "local"

    def __init__(
        self, python: str | None = None, isolation: str | None = None, min_isolation: str = "auto"
    ) -> None:
        self.python = python or sys.executable
        remove_stale()
        self.isolation: Isolation
        failed: tuple[tuple[str, str], ...] | None = None  # None: forced, not probed
        if isolation is None:
            probe = probe_isolation(self.python)
            self.isolation, failed = probe.level, probe.failed
        else:
            levels = {iso.name: iso for iso in candidates()}
            if isolation not in levels:
                raise ValueError(
                    f"sandbox isolation '{isolation}' is not available here; choose from {', '.join(levels)}"
                )
            self.isolation = levels[isolation]
        check_minimum(self.isolation, min_isolation, failed)
        self.min_isolation = min_isolation

    def run(self, program: str, stdin: str = "", limits: Limits | None = None) -> ExecResult:
        return _run(self.isolation, self.python, program, stdin, limits or Limits())


EXECUTORS: dict[str, Callable[[], Executor]] = {"local": LocalSandbox}


def register_executor(name: str, factory: Callable[[], Executor]) -> None:
    """Make `get_executor(name)` return `factory()`: e.g. a client of a container sandbox service."""
    EXECUTORS[name] = factory


def make_executor(spec: str = "local", min_isolation: str = "auto") -> Executor:
    """The code tasks' sandbox (reward.sandbox_executor): the built-in one, checked against
    `min_isolation`, or the Executor your factory returns (its isolation is its own)."""
    if spec == "local":
        return LocalSandbox(min_isolation=min_isolation)
    return get_executor(spec, "reward.sandbox_executor")


def get_executor(name: str = "local", key: str = "--executor") -> Executor:
    """A registered executor by name, or a factory of your own as module:function / path/to/file.py:function
    (imported here: a command line never runs the code that registered one)."""
    if name in EXECUTORS:
        return EXECUTORS[name]()
    if ":" in name:
        from streamrl.user_code import load_object

        return load_object(name, key)()
    raise ValueError(
        f"{key}: unknown sandbox executor '{name}'; choose from {', '.join(sorted(EXECUTORS))}, or name a "
        "factory of your own as module:function or path/to/file.py:function"
    )
