"""A trainer killed alone (SIGKILL to its pid, as the OOM killer does, not to its process group) leaves
no process behind: its rollout workers notice and exit, and with them the fork server and the resource
tracker, which live only as long as someone holds their pipes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from test_chaos import _descendants, _lines, _rollout_workers, _start
from tiny_args import TINY


def _running(pid: int) -> bool:
    """Not ended: a zombie (ended, not yet reaped by whoever adopted it) counts as ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_killing_the_trainer_alone_ends_its_workers_fork_server_and_resource_tracker(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start([*TINY, "max_steps=500", f"run_dir={run}"], stderr=tmp_path / "stderr.log")
    try:
        deadline = time.monotonic() + 300  # a limit against a hang, not a speed check
        while not (_lines(run / "metrics.jsonl") and _rollout_workers(proc.pid)):
            assert proc.poll() is None, (tmp_path / "stderr.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "no step logged"
            time.sleep(0.05)
        workers = _rollout_workers(proc.pid)
        left = set(_descendants(proc.pid))  # the fork server, the resource tracker, the workers
        assert workers and set(workers) < left
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the trainer alone: its children stay in its group
        proc.wait(timeout=60)
    deadline = time.monotonic() + 120  # generous: a worker may be mid decode step on a loaded machine
    while (alive := sorted(p for p in left if _running(p))) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in alive:  # clean up before failing, so a failure leaves nothing running either
        os.kill(pid, signal.SIGKILL)
    assert alive == [], "still running after the trainer was killed"
