"""A run on Ray stops at a safe point on SIGTERM, as it does on Ctrl-C: ray.init's own SIGTERM handler
(which ends the local instance and exits at once) and the C-level one it installs (which logs the
signal) do not replace the run's. One local Ray instance, in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one Ray instance at a time under pytest -n (one worker)

SCRIPT = """
import os, signal, time
import ray
from streamrl.config import load_config
from streamrl.placement.ray_rollouts import ensure_ray

got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))  # as loop/signals.py StopFlag
assert ensure_ray(load_config(None, ["runtime.backend=ray", "ray.num_cpus=1"]))
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 10
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
print("handled", got, ray.is_initialized(), flush=True)
ray.shutdown()
"""


def test_a_sigterm_after_ray_starts_reaches_the_runs_handler():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert (p.returncode, p.stdout.splitlines()[-1:]) == (0, ["handled [15] True"]), p.stderr[-3000:]
    assert "SIGTERM received" not in p.stderr
