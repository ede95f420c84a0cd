"""The local sandbox: hostile programs end with a non-ok status, in bounded time, leaving nothing behind."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from streamrl.rewards.sandbox import (
    EXECUTORS,
    ExecResult,
    Limits,
    LocalSandbox,
    get_executor,
    register_executor,
)

FAST = Limits(cpu_s=1, wall_s=3, memory_mb=256, max_processes=8)


@pytest.fixture(scope="module")
def sb() -> LocalSandbox:
    return LocalSandbox()


def _leftovers() -> list[int]:
    """Processes still running a sandbox bootstrap (its argv holds the workdir 'streamrl-sbx-...')."""
    found = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and b"streamrl-sbx-" in Path(f"/proc/{d}/cmdline").read_bytes():
                found.append(int(d))
        except OSError:
            pass
    return found


def test_correct_program_reads_stdin(sb: LocalSandbox) -> None:
    r = sb.run("a, b = map(int, input().split())\nprint(a + b)\n", "2 40\n", FAST)
    assert (r.status, r.exit_code, r.stdout, r.stderr) == ("ok", 0, "42\n", "")
    assert r.isolation == sb.isolation.name


def test_crash_reports_stderr(sb: LocalSandbox) -> None:
    r = sb.run("raise ValueError('boom')\n", "", FAST)
    assert (r.status, r.exit_code) == ("error", 1)
    assert r.stderr.rstrip().endswith("ValueError: boom")


def test_infinite_loop_times_out_in_bounded_time(sb: LocalSandbox) -> None:
    t0 = time.monotonic()
    r = sb.run("while True:\n    pass\n", "", Limits(cpu_s=5, wall_s=1.5))
    assert r.status == "timeout" and r.exit_code is None
    assert 1.4 < time.monotonic() - t0 < 3.0
    assert _leftovers() == []


def test_sleeping_child_is_killed_with_the_group(sb: LocalSandbox) -> None:
    # the program exits at once but leaves a child behind that tries to escape with setsid
    prog = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')\n"
    r = sb.run(prog, "", FAST)
    assert r.stdout == "parent done\n"
    if sb.isolation.name != "rlimits":  # the PID namespace takes the setsid child down too
        assert _leftovers() == []


def test_fork_bomb_is_contained(sb: LocalSandbox) -> None:
    prog = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    r = sb.run(prog, "", Limits(cpu_s=1, wall_s=2, memory_mb=256, max_processes=8))
    assert r.status != "ok"
    assert time.monotonic() - t0 < 4.0
    deadline = time.monotonic() + 2.0
    while _leftovers() and time.monotonic() < deadline:  # the kernel reaps a dying namespace quickly
        time.sleep(0.05)
    assert _leftovers() == []
    assert sb.run("print('still fine')", "", FAST).stdout == "still fine\n"  # the host can still fork


def test_memory_bomb(sb: LocalSandbox) -> None:
    r = sb.run("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))\n", "", FAST)
    assert r.status == "memory" and r.wall_s < 3.0


def test_write_outside_workdir_does_not_land(sb: LocalSandbox, tmp_path: Path) -> None:
    if sb.isolation.fs != "ro":
        pytest.skip(f"isolation '{sb.isolation.name}' has no read-only filesystem (documented)")
    open_dir = Path(tempfile.mkdtemp(prefix="streamrl-test-"))  # world-writable: only the mount stops it
    open_dir.chmod(0o777)
    try:
        for target in (tmp_path / "escape.txt", open_dir / "escape.txt"):
            prog = f"open({str(target)!r}, 'w').write('pwned')\nprint('wrote')\n"
            r = sb.run(prog, "", FAST)
            assert r.status == "error" and r.stdout == ""
            assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr
            assert not target.exists()
        assert "Read-only file system" in r.stderr
    finally:
        shutil.rmtree(open_dir)


def test_workdir_is_writable_but_size_capped(sb: LocalSandbox) -> None:
    ok = sb.run("open('f.txt', 'w').write('x' * 1000)\nprint(len(open('f.txt').read()))\n", "", FAST)
    assert ok.stdout == "1000\n"
    big = sb.run("open('f.txt', 'wb').write(b'x' * (3 * 2**20))\n", "", Limits(file_size_mb=2))
    assert big.status != "ok"


def test_parent_environment_is_not_inherited(sb: LocalSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRL_TEST_SECRET", "hunter2-do-not-leak")
    r = sb.run("import os\nprint(dict(os.environ))\n", "", FAST)
    assert r.status == "ok"
    assert "hunter2" not in r.stdout and "STREAMRL_TEST_SECRET" not in r.stdout
    assert sorted(eval(r.stdout)) == ["HOME", "LANG", "PATH", "TMPDIR"]


def _server() -> tuple[socket.socket, list[socket.socket]]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(4.0)
    accepted: list[socket.socket] = []

    def accept() -> None:
        try:
            accepted.append(srv.accept()[0])
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    return srv, accepted


@pytest.mark.parametrize("isolation", [None, "rlimits"])
def test_network_is_unreachable(isolation: str | None) -> None:
    srv, accepted = _server()
    port = srv.getsockname()[1]
    prog = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
    r = LocalSandbox(isolation=isolation).run(prog, "", FAST)
    srv.close()
    assert r.status == "error"
    assert "unreachable" in r.stderr or "network access is disabled" in r.stderr
    assert accepted == []


def test_output_is_capped(sb: LocalSandbox) -> None:
    r = sb.run("while True:\n    print('x' * 1000)\n", "", Limits(output_bytes=10_000))
    assert r.status == "output_limit" and len(r.stdout) <= 10_000


def test_overhead_per_run_is_small(sb: LocalSandbox) -> None:
    walls = sorted(sb.run("print(1)", "", FAST).wall_s for _ in range(5))
    assert walls[2] < 0.3, walls  # measured ~0.02 s on 2 cores; generous for loaded CI


def test_limits_and_registry_errors() -> None:
    with pytest.raises(ValueError, match=r"Limits.wall_s must be > 0, got 0"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="unknown sandbox executor 'nope'; choose from local"):
        get_executor("nope")
    with pytest.raises(ValueError, match="sandbox isolation 'chroot' is not available here"):
        LocalSandbox(isolation="chroot")
    assert isinstance(get_executor("local"), LocalSandbox)


def test_register_custom_executor() -> None:
    class Echo:
        name = "echo"

        def run(self, program: str, stdin: str = "", limits: Limits | None = None) -> ExecResult:
            return ExecResult(stdin, "", 0, "ok", 0.0, "none")

    register_executor("echo", Echo)
    try:
        assert get_executor("echo").run("print(1)", "hi").stdout == "hi"
    finally:
        del EXECUTORS["echo"]
