"""Bootstrap that runs INSIDE the sandbox before the untrusted program (stdlib only, no streamrl imports).

    python -I _sandbox_boot.py '<json config>'

Config keys: workdir (str, holds program.py); cpu_s, memory_mb, file_size_mb, nproc (rlimits);
fs ("ro": a fresh size-capped tmpfs on workdir, every other mount read-only; "none"); tmpfs_mb;
drop ("uid:N": setuid to N, for a root host; "caps": drop all capabilities, for a user namespace;
"none"); audit_hook (bool: refuse sockets, other programs and ctypes; the fallback without namespaces).
wall_s (the wall-clock limit, enforced here too); parent (the pid of the process that started the
sandbox: without a PID namespace this process dies with it).
In a new PID namespace this process is pid 1 and forks the program's process first (see
_init_of_pid_namespace); without one it forks too and stays the program's supervisor (_supervise).
Either way the program is killed at wall_s even if the process that started the sandbox no longer
watches it. The order matters: mounts need privileges, so they happen first; privileges are dropped
before a single line of the program runs. Any setup failure exits with code 97 and one stderr line,
which the parent reports as status "error" (the probe uses it to pick a weaker level).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

SETUP_FAILED = 97
WALL_EXIT = 124  # the exit code of the init or supervisor that killed the program at wall_s
WALL_MARK = "sandbox wall-clock limit reached"  # the last stderr line when this process killed it
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_MOVE, _MS_REC = 2, 4, 4096, 8192, 16384
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 1, 2, 4
_SYS_MOUNT_SETATTR = 442  # same number on every architecture (added in Linux 5.12)
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
_PR_SET_CHILD_SUBREAPER = 36


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _read_only_root(libc: ctypes.CDLL, workdir: str, tmpfs_mb: int, expose: bool) -> None:
    """A fresh size-capped tmpfs on workdir, the only writable mount; every other mount of this
    (private) mount namespace read-only, nosuid, nodev. expose: see _expose_interpreter."""
    opts = f"size={tmpfs_mb}m,mode=1777".encode()
    _check(libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts), "mount tmpfs")
    if expose:
        _expose_interpreter(libc, workdir)
    # the tmpfs is made read-only too; then reopened writable (we own it, its flag is not locked)
    attr = _MountAttr(_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, 0, 0, 0)
    rc = libc.syscall(
        _SYS_MOUNT_SETATTR, _AT_FDCWD, b"/", _AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    _check(rc, "mount_setattr(/, read-only)")
    rw = _MountAttr(0, _MOUNT_ATTR_RDONLY, 0, 0)
    rc = libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, workdir.encode(), 0, ctypes.byref(rw), ctypes.sizeof(rw))
    _check(rc, "mount_setattr(workdir, writable)")


def _blocked_ancestor(path: str) -> str | None:
    """The topmost directory above `path` that other users cannot enter (e.g. /root, mode 0700)."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        d = "/" + "/".join(parts[:i])
        if not os.stat(d).st_mode & 0o001:
            return d
    return None


def _expose_interpreter(libc: ctypes.CDLL, workdir: str) -> None:
    """Let an unprivileged uid run this interpreter when it lives under a private directory (pyenv in
    /root): hide that directory behind an empty tmpfs and bind back only the interpreter's own dirs."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path)}
    dirs.add(os.path.dirname(os.path.realpath(sys.executable)))
    dirs = {d for d in dirs if os.path.isdir(d)}
    dirs = sorted(d for d in dirs if not any(d.startswith(o + "/") for o in dirs))  # outermost only
    plan = [(d, a) for d in dirs if (a := _blocked_ancestor(d)) is not None]
    staged = []
    for i, (d, _) in enumerate(plan):  # bind to staging first: the tmpfs will hide the originals
        stage = os.path.join(workdir, f".stage{i}")
        os.mkdir(stage)
        _check(libc.mount(d.encode(), stage.encode(), None, _MS_BIND | _MS_REC, None), f"bind {d}")
        staged.append(stage)
    for a in sorted({a for _, a in plan}):
        _check(
            libc.mount(b"tmpfs", a.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,mode=0755"),
            f"mask {a}",
        )
    for (d, _), stage in zip(plan, staged):
        os.makedirs(d, mode=0o755, exist_ok=True)
        _check(libc.mount(stage.encode(), d.encode(), None, _MS_MOVE, None), f"move {d}")
        os.rmdir(stage)


def _reopen_private_paths() -> None:
    """Keep imports working after a uid drop without a mount namespace when the interpreter lives under
    a private directory (pyenv in /root): each import directory below one is reached through an open
    descriptor, /proc/self/fd/N, whose lookup skips the blocked ancestors (a process may always use its
    own descriptors). Covers sys.path and the __path__ of packages already imported."""
    subst: dict[str, str] = {}
    for p in sys.path:
        if os.path.isdir(p) and (_blocked_ancestor(p) or _blocked_ancestor(os.path.realpath(p))):
            subst[p] = f"/proc/self/fd/{os.open(p, os.O_RDONLY | os.O_DIRECTORY)}"
    longest_first = sorted(subst, key=len, reverse=True)

    def sub(path: str) -> str:
        for old in longest_first:
            if path == old or path.startswith(old + "/"):
                return subst[old] + path[len(old) :]
        return path

    sys.path[:] = [sub(p) for p in sys.path]
    for mod in list(sys.modules.values()):
        paths = getattr(mod, "__path__", None)
        if isinstance(paths, list):
            paths[:] = [sub(p) for p in paths]


# audit events that start another program; `import _posixsubprocess` too: its fork_exec audits nothing
_NEW_PROGRAM = {"subprocess.Popen", "os.exec", "os.posix_spawn", "os.system", "os.spawn", "os.startfile"}


def _refuse(event: str, args: tuple) -> None:
    """The audit hook of the fallback without namespaces: no sockets, no new programs (a child process
    would not carry this hook; a fork keeps it), no ctypes (foreign calls skip every audit event)."""
    what = None
    if event.startswith("socket."):
        what = "network access"
    elif event in _NEW_PROGRAM or (event == "import" and args[0] == "_posixsubprocess"):
        what = "starting another program"
    elif event.startswith("ctypes."):
        what = "ctypes"
    if what is not None:
        detail = f"import {args[0]}" if event == "import" else event
        raise PermissionError(f"{what} is disabled in the sandbox ({detail})")


def _drop_caps(libc: ctypes.CDLL) -> None:
    """Empty the bounding set (exec cannot regain caps) and clear our own caps (no remount rw)."""
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EINVAL past the last capability this kernel knows
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective/permitted/inheritable x 2 words, all zero
    _check(libc.capset(header, data), "capset")


def _set_limits(cfg: dict) -> None:
    """Soft = hard, so the program cannot raise them; CPU hard is 1 s later so SIGXCPU comes first."""
    cpu = max(1, int(cfg["cpu_s"] + 0.999))
    mib = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_mb"] * mib,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_size_mb"] * mib,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # set here, after the namespaces exist, so only processes inside the sandbox count
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))


def _say_wall_limit(wall_s: float) -> None:
    os.write(2, f"\n{WALL_MARK} ({wall_s:g} s)\n".encode())


def _init_of_pid_namespace(wall_s: float) -> None:
    """As pid 1 of a new PID namespace the kernel drops every signal it has no handler for, SIGXCPU
    included: so pid 1 only reaps, the program runs in its first child (pid 2), and pid 1 exits as that
    child did (a signal as 128 + its number); the kernel then kills the rest of the namespace.
    At wall_s pid 1 exits (WALL_EXIT), which ends the namespace too: the program never outlives its
    limit, even when the process that started the sandbox stopped watching it. pid 1 itself gets
    SIGKILL when `unshare` dies (--kill-child), and `unshare` when the process that started it dies
    (see sandbox.py)."""
    child = os.fork()
    if child == 0:
        return

    def wall_limit(signum: int, frame: object) -> None:
        _say_wall_limit(wall_s)
        os._exit(WALL_EXIT)

    signal.signal(signal.SIGALRM, wall_limit)  # a handler: pid 1 receives the signal
    signal.setitimer(signal.ITIMER_REAL, wall_s)
    while True:
        pid, status = os.wait()  # orphans of the namespace are reparented here
        if pid == child:
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _die_with_parent(libc: ctypes.CDLL, parent: int, sig: int) -> None:
    """Get `sig` when the parent exits (PR_SET_PDEATHSIG; Linux sends it when the parent's thread that
    started this process exits, and the sandbox's starters wait for their child in that same thread);
    exit at once when the parent is gone already (this process was reparented before the signal was
    armed). A change of uid clears the setting, so it is armed after the uid drop."""
    _check(libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        os._exit(SETUP_FAILED)


def _exit_as(libc: ctypes.CDLL, status: int) -> None:
    """Exit as a child whose wait status is `status` did: the same exit code, or the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # SIGXCPU, SIGSEGV...: no core dump of this process
        if sig != signal.SIGKILL:  # whose action cannot be changed
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # not reached for a signal that terminates
    os._exit(os.WEXITSTATUS(status))


class _Stop(Exception):
    """The supervisor's signal handlers raise it: args[0] is the signal (SIGALRM: wall_s; SIGTERM: the
    process that started the sandbox died)."""


def _children() -> list[int]:
    """This process's children, zombies included."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", encoding="ascii") as f:
            return [int(pid) for pid in f.read().split()]
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: ask every process for its parent
        kids = []
        for d in os.listdir("/proc"):
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    if d.isdigit() and int(f.read().rsplit(b")", 1)[1].split()[1]) == me:
                        kids.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
        return kids


def _end_descendants() -> None:
    """SIGKILL every process below this one and reap it. This process is a child subreaper, so every
    orphan below it comes here, whether or not it left the process group (setsid): repeat until none
    is left."""
    while True:
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.wait()
        except ChildProcessError:
            return


def _supervise(libc: ctypes.CDLL, parent: int, wall_s: float) -> int:
    """Without a PID namespace (rlimits): this process, the session leader, stays the program's
    supervisor and the program runs in its child. Like a namespace's init it reaps the orphans below it
    (a child subreaper) and, when the program exits, at wall_s, or when the process that started the
    sandbox dies (`parent`: a SIGTERM through PR_SET_PDEATHSIG), SIGKILLs every process below it, even
    one that called setsid; then it exits as the program did (WALL_EXIT at wall_s). Returns (in the
    child) the supervisor's pid, for the program's own parent-death signal (see main)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not ignored, should the caller ignore it
    _die_with_parent(libc, parent, signal.SIGTERM)  # default action until the handler below is set
    _check(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
    supervisor = os.getpid()
    child = os.fork()
    if child == 0:
        return supervisor

    def stop(signum: int, frame: object) -> None:
        raise _Stop(signum)

    try:
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, wall_s)
        while True:
            pid, status = os.wait()
            if pid == child:
                break
    except _Stop as e:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGALRM})
        _end_descendants()
        if e.args[0] == signal.SIGALRM:
            _say_wall_limit(wall_s)
        os._exit(WALL_EXIT if e.args[0] == signal.SIGALRM else SETUP_FAILED)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGALRM})
    _end_descendants()  # what the program left running
    _exit_as(libc, status)
    return 0  # not reached


def main() -> None:
    cfg = json.loads(sys.argv[1])
    workdir = cfg["workdir"]
    libc = ctypes.CDLL(None, use_errno=True)
    supervisor = None
    try:
        if os.getpid() == 1:
            _init_of_pid_namespace(cfg["wall_s"])
        else:
            supervisor = _supervise(libc, cfg["parent"], cfg["wall_s"])
        with open(os.path.join(workdir, "program.py"), encoding="utf-8") as f:
            source = f.read()
        if cfg["fs"] == "ro":
            _read_only_root(libc, workdir, cfg["tmpfs_mb"], cfg["drop"].startswith("uid:"))
            with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as f:
                f.write(source)  # into the tmpfs, so tracebacks can show source lines
        drop = cfg["drop"]
        if drop.startswith("uid:") and cfg["fs"] == "none":
            _reopen_private_paths()
        if drop.startswith("uid:"):
            uid = int(drop[4:])
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)  # 0 -> non-zero clears every capability
        elif drop == "caps":
            _drop_caps(libc)
        _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _set_limits(cfg)
        if supervisor is not None:  # the program dies with its supervisor, even one killed by SIGKILL
            _die_with_parent(libc, supervisor, signal.SIGKILL)
        os.chdir(workdir)
    except (OSError, ValueError) as e:
        print(f"sandbox setup failed: {e}", file=sys.stderr)
        sys.exit(SETUP_FAILED)
    if cfg["audit_hook"]:
        sys.addaudithook(_refuse)
    del libc
    sys.argv = ["program.py"]
    sys.path.insert(0, workdir)
    code = compile(source, "program.py", "exec")
    try:
        exec(code, {"__name__": "__main__", "__file__": "program.py", "__builtins__": __builtins__})
    except SystemExit:
        raise
    except BaseException as e:  # report like `python program.py` would: no bootstrap frames
        import traceback

        traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
        sys.exit(1)


if __name__ == "__main__":
    main()
