"""The local sandbox: the isolation level this machine allows, hostile programs ending with the exact
status expected and leaving nothing behind, the rlimits fallback on its own, no network for the program
or a child it starts."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bounded import eventually
from sandbox_levels import LEVELS, level_works
from sandbox_procs import sandboxed

from streamrl.rewards import sandbox, sandbox_probe
from streamrl.rewards.sandbox import ExecResult, Limits, LocalSandbox

OK = Limits(cpu_s=2, wall_s=30, memory_mb=256, max_processes=8)  # programs expected to finish
ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not ROOT, reason="the rlimits level drops the uid only when run as root")


def _expected_level() -> str:
    """Found without the sandbox's probe: root with a working unshare -> ns-root; not root with
    working user namespaces -> ns-user; else rlimits."""
    if ROOT and level_works("ns-root"):
        return "ns-root"
    if not ROOT and level_works("ns-user"):
        return "ns-user"
    return "rlimits"


EXPECTED = _expected_level()
needs_ns = pytest.mark.skipif(EXPECTED == "rlimits", reason="no namespaces on this machine")


@pytest.fixture(scope="module")
def sb() -> LocalSandbox:
    return LocalSandbox()


@pytest.fixture(scope="module")
def fallback() -> LocalSandbox:
    return LocalSandbox(isolation="rlimits", min_isolation="rlimits")


@pytest.fixture(params=["probed", "rlimits"])
def box(request: pytest.FixtureRequest) -> LocalSandbox:
    """Each test using it runs on the probed level (fixture sb) and on the rlimits fallback."""
    return request.getfixturevalue("sb" if request.param == "probed" else "fallback")


@pytest.fixture
def own_workdirs(sandbox_root: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test's own directory (fixture sandbox_root) as tempfile's default, where the sandbox makes its
    workdirs: the leftover check sees this test's processes only."""
    monkeypatch.setattr(tempfile, "tempdir", sandbox_root)
    return sandbox_root


def _leftovers_after_reaping(root: str) -> list[int]:
    """sandboxed(root) once the processes the sandbox SIGKILLed have finished exiting (the kernel tears
    them down after the run returns), or after 10 s if some never go."""
    eventually(lambda: not sandboxed(root), 10.0, poll_s=0.05)
    return sandboxed(root)


def _last_line(r: ExecResult) -> str:
    return r.stderr.strip().splitlines()[-1]


def test_isolation_is_the_strongest_this_machine_allows(sb: LocalSandbox) -> None:
    assert sb.isolation.name == EXPECTED
    r = sb.run("print('hi')\n", "", OK)
    assert (r.status, r.stdout, r.isolation) == ("ok", "hi\n", EXPECTED)


def test_correct_program_reads_stdin(box: LocalSandbox) -> None:
    r = box.run("a, b = map(int, input().split())\nprint(a + b)\n", "2 40\n", OK)
    assert (r.status, r.exit_code, r.stdout, r.stderr) == ("ok", 0, "42\n", "")
    assert r.isolation == box.isolation.name


def test_crash_reports_stderr(box: LocalSandbox) -> None:
    r = box.run("raise ValueError('boom')\n", "", OK)
    assert (r.status, r.exit_code, _last_line(r)) == ("error", 1, "ValueError: boom")


def test_infinite_loop_is_killed_at_the_wall_limit(box: LocalSandbox, own_workdirs: str) -> None:
    r = box.run("while True:\n    pass\n", "", Limits(cpu_s=60, wall_s=1.5))
    assert (r.status, r.exit_code) == ("timeout", None)  # None: the sandbox killed it
    assert _leftovers_after_reaping(own_workdirs) == []


def test_cpu_limit_is_a_timeout(box: LocalSandbox) -> None:
    r = box.run("while True:\n    pass\n", "", Limits(cpu_s=1, wall_s=120))
    # SIGXCPU: directly (rlimits), or the exit code of the namespace's init (128 + signal)
    sigxcpu = -signal.SIGXCPU if box.isolation.name == "rlimits" else 128 + signal.SIGXCPU
    assert (r.status, r.exit_code) == ("timeout", sigxcpu)


@pytest.mark.parametrize("level", LEVELS)
def test_cpu_limit_is_a_timeout_at_every_level(level: str, own_workdirs: str) -> None:
    # forced, not probed: each level on its own. In a PID namespace the CPU signal must reach the program
    # (not the namespace's init, which ignores it): once it was an `error` ("unshare: sigprocmask unblock
    # failed: Invalid argument") instead of a timeout
    if not level_works(level):
        pytest.skip(f"{level} cannot run on this machine")
    box = LocalSandbox(isolation=level, min_isolation="rlimits")
    r = box.run("while True:\n    pass\n", "", Limits(cpu_s=1, wall_s=120))
    sigxcpu = -signal.SIGXCPU if level == "rlimits" else 128 + signal.SIGXCPU
    assert (r.status, r.exit_code, r.stderr, r.isolation) == ("timeout", sigxcpu, "", level)
    assert _leftovers_after_reaping(own_workdirs) == []


@needs_ns
def test_setsid_child_dies_with_the_namespace(sb: LocalSandbox, own_workdirs: str) -> None:
    # the program exits at once but leaves a child behind that tries to escape with setsid
    prog = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')\n"
    r = sb.run(prog, "", OK)
    assert (r.status, r.exit_code, r.stdout) == ("ok", 0, "parent done\n")
    assert _leftovers_after_reaping(own_workdirs) == []


_FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
_PRIVILEGES = (
    "import resource\nstatus = open('/proc/self/status').read()\n"
    "print(status.split('CapEff:')[1].split()[0], *resource.getrlimit(resource.RLIMIT_NPROC))\n"
)


def test_fork_bomb_is_contained(box: LocalSandbox, own_workdirs: str) -> None:
    if box.isolation.name == "rlimits" and not ROOT:
        pytest.skip("the rlimits level drops the uid only when run as root")
    # what contains it: no capability (root ignores RLIMIT_NPROC) and the process limit. Checked first,
    # so a sandbox that lost either fails here instead of fork-bombing the machine.
    r = box.run(_PRIVILEGES, "", OK)
    nproc = str(OK.max_processes + (box.isolation.drop == "caps"))  # ns-user: init is the same user
    assert (r.status, r.stdout.split()) == ("ok", ["0000000000000000", nproc, nproc])
    r = box.run(_FORK_BOMB, "", Limits(cpu_s=1, wall_s=2, memory_mb=256, max_processes=OK.max_processes))
    assert (r.status, r.stdout) == ("timeout", "")  # the spinning processes run into the CPU/wall limit
    assert _leftovers_after_reaping(own_workdirs) == []
    assert box.run("print('still fine')", "", OK).stdout == "still fine\n"  # the host can still fork


def test_the_rlimits_level_budgets_the_uids_threads_not_its_processes(tmp_path: Path) -> None:
    """Linux counts a uid's threads against RLIMIT_NPROC: a host of 2 processes with 3 and 1 threads
    leaves max_processes only if the limit adds 4, not 2."""
    for pid, tids in (("123", ("123", "124", "125")), ("456", ("456",))):
        for tid in tids:
            (tmp_path / pid / "task" / tid).mkdir(parents=True)
    (tmp_path / "self").mkdir()  # not a process directory
    assert sandbox._user_task_count(str(tmp_path)) == 4
    assert sandbox._user_task_count() >= len(os.listdir("/proc/self/task"))


def test_memory_bomb(box: LocalSandbox) -> None:
    r = box.run("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))\n", "", OK)
    assert (r.status, r.exit_code, _last_line(r)) == ("memory", 1, "MemoryError")


@needs_ns
def test_write_outside_workdir_does_not_land(sb: LocalSandbox, tmp_path: Path) -> None:
    open_dir = Path(tempfile.mkdtemp(prefix="streamrl-test-"))  # world-writable: only the mount stops it
    open_dir.chmod(0o777)
    try:
        for target, error in (
            (tmp_path / "escape.txt", "PermissionError: [Errno 13] Permission denied"),  # a 0700 parent
            (open_dir / "escape.txt", "OSError: [Errno 30] Read-only file system"),
        ):
            r = sb.run(f"open({str(target)!r}, 'w').write('pwned')\nprint('wrote')\n", "", OK)
            assert (r.status, r.stdout, _last_line(r)) == ("error", "", f"{error}: {str(target)!r}")
            assert not target.exists()
    finally:
        shutil.rmtree(open_dir)


@root_only
def test_fallback_write_outside_workdir_does_not_land(fallback: LocalSandbox, tmp_path: Path) -> None:
    target = tmp_path / "escape.txt"  # root's 0700 directory: the dropped uid may not write there
    r = fallback.run(f"open({str(target)!r}, 'w').write('pwned')\nprint('wrote')\n", "", OK)
    assert (r.status, r.stdout) == ("error", "")
    assert _last_line(r) == f"PermissionError: [Errno 13] Permission denied: {str(target)!r}"
    assert not target.exists()


def test_workdir_is_writable_but_size_capped(box: LocalSandbox) -> None:
    ok = box.run("open('f.txt', 'w').write('x' * 1000)\nprint(len(open('f.txt').read()))\n", "", OK)
    assert (ok.status, ok.stdout) == ("ok", "1000\n")
    big = box.run("open('f.txt', 'wb').write(b'x' * (3 * 2**20))\n", "", Limits(file_size_mb=2, wall_s=30))
    # namespaces: the workdir tmpfs (file_size_mb) is full first; rlimits: RLIMIT_FSIZE refuses the
    # write (EFBIG: Python ignores SIGXFSZ)
    error = "OSError: [Errno 27] File too large"
    if box.isolation.fs == "ro":
        error = "OSError: [Errno 28] No space left on device"
    assert (big.status, big.exit_code, _last_line(big)) == ("error", 1, error)


def test_parent_environment_is_not_inherited(box: LocalSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRL_TEST_SECRET", "hunter2-do-not-leak")
    r = box.run("import os\nprint(dict(os.environ))\n", "", OK)
    assert r.status == "ok"
    assert "hunter2" not in r.stdout and "STREAMRL_TEST_SECRET" not in r.stdout
    assert sorted(eval(r.stdout)) == ["HOME", "LANG", "PATH", "TMPDIR"]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP listener on 127.0.0.1 (port from the OS), open for the whole test."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    yield srv
    srv.close()


def _assert_nothing_connected(srv: socket.socket) -> None:
    # a connection the program made is in the accept queue by the time its run has returned
    srv.setblocking(False)
    with pytest.raises(BlockingIOError):
        srv.accept()


def _connect(port: int) -> str:
    return f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')"


def test_network_is_unreachable(box: LocalSandbox, listener: socket.socket) -> None:
    r = box.run(_connect(listener.getsockname()[1]) + "\n", "", OK)
    error = "OSError: [Errno 101] Network is unreachable"
    if box.isolation.name == "rlimits":
        error = "PermissionError: network access is disabled in the sandbox (socket.getaddrinfo)"
    assert (r.status, r.exit_code, _last_line(r)) == ("error", 1, error)
    _assert_nothing_connected(listener)


# a child process that is not this interpreter: it would not carry the rlimits level's audit hook
_SPAWN = {  # how the program starts it -> the audit event the rlimits level refuses
    "subprocess": ("import subprocess\nsubprocess.run(argv, check=True)\n", "import _posixsubprocess"),
    "posix_spawn": (
        "import os\n_, st = os.waitpid(os.posix_spawn(argv[0], argv, {}), 0)\n"
        "sys.exit(os.waitstatus_to_exitcode(st))\n",
        "os.posix_spawn",
    ),
    "execv": ("import os\nos.execv(argv[0], argv)\n", "os.exec"),
    "system": (
        "import os, shlex\nsys.exit(os.waitstatus_to_exitcode(os.system(shlex.join(argv))))\n",
        "os.system",
    ),
    "ctypes": (
        "import ctypes, os, shlex\n"
        "sys.exit(os.waitstatus_to_exitcode(ctypes.CDLL(None).system(shlex.join(argv).encode())))\n",
        "ctypes.dlopen",
    ),
}


@pytest.mark.parametrize("how", list(_SPAWN))
def test_child_process_cannot_reach_the_network(box: LocalSandbox, listener: socket.socket, how: str) -> None:
    code, event = _SPAWN[how]
    prog = f"import sys\nargv = [sys.executable, '-c', {_connect(listener.getsockname()[1])!r}]\n{code}"
    r = box.run(prog, "", OK)
    assert (r.status, r.exit_code) == ("error", 1)
    if box.isolation.name == "rlimits":
        what = "ctypes" if how == "ctypes" else "starting another program"
        assert _last_line(r) == f"PermissionError: {what} is disabled in the sandbox ({event})"
    else:  # the child starts, in the same empty network namespace
        assert "OSError: [Errno 101] Network is unreachable" in r.stderr
    _assert_nothing_connected(listener)


def test_output_is_capped(box: LocalSandbox) -> None:
    r = box.run("while True:\n    print('x' * 1000)\n", "", Limits(output_bytes=10_000, wall_s=30))
    assert (r.status, r.exit_code, len(r.stdout)) == ("output_limit", None, 10_000)


def test_namespaces_possible_matches_this_machine() -> None:
    assert sandbox_probe.namespaces_possible() == (EXPECTED != "rlimits")
