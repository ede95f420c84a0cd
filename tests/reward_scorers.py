"""Top-level scorers for RewardService tests: importable by spawned worker processes."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def length_reward(text: str) -> float:
    return float(len(text))


def sum_with_info(a: float, b: float) -> tuple[float, dict]:
    return a + b, {"terms": [a, b]}


def raise_value_error(message: str) -> float:
    raise ValueError(message)


def maybe_die(code: int) -> float:
    """code != 0: the worker vanishes mid-call, no cleanup, no result (like an OOM kill)."""
    if code:
        os._exit(code)
    return 1.0


def maybe_segfault(crash: bool) -> float:
    if crash:
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return 1.0


def count_calls(path: str, text: str) -> float:
    """Appends one line per real call, so a test can prove a cache hit made no call."""
    with Path(path).open("a") as f:
        f.write(text + "\n")
    return float(len(text))


def unpicklable_info() -> tuple[float, dict]:
    return 1.0, {"lock": threading.Lock()}


def nan_reward() -> float:
    return float("nan")


def not_a_number() -> str:
    return "high"


def record_pid_then_sleep(path: str, seconds: float) -> float:
    """Writes this process's id (whole: a test that sees the file reads all of it), then sleeps."""
    part = Path(f"{path}.part")
    part.write_text(str(os.getpid()))
    part.replace(path)
    time.sleep(seconds)
    return 1.0


def wait_for_gate(gate: str, value: float, started: str = "", limit_s: float = 60.0) -> float:
    """Touches `started` (if given), then waits until the file `gate` exists (at most limit_s): -> value.
    A test opens the gate only after the service answered, so a service that waited for this call to
    finish (a deadline not enforced, a close that joins running calls) would still be stuck."""
    if started:
        Path(started).touch()
    deadline = time.monotonic() + limit_s
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return value


def keep_then_wait(gate: str, keep: str) -> float:
    """Keeps {"kept": keep} for a failure to come (unless keep is empty), then waits for `gate`."""
    from streamrl.rewards.workers import keep_on_failure

    if keep:
        keep_on_failure({"kept": keep})
    return wait_for_gate(gate, 1.0)


def meet(folder: str, name: str, n: int, limit_s: float = 30.0) -> float:
    """Touches folder/name, then waits for n such marks: -> 1.0 once n scorers are in this function
    at the same time, 0.0 if limit_s passes first (the calls ran one after another)."""
    Path(folder, name).touch()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if sum(1 for _ in Path(folder).iterdir()) >= n:
            return 1.0
        time.sleep(0.01)
    return 0.0


def parity_unless_even_prompt(
    prompts: list[str], completion_ids: list[list[int]], **_: object
) -> list[float]:
    """A user reward (TRL convention) for screening: 0 for every response to a prompt of even length (a
    group all alike), else the parity of the response's first token (a group that usually disagrees)."""
    if len(prompts[0]) % 2 == 0:
        return [0.0]
    return [float(completion_ids[0][0] % 2) if completion_ids[0] else 0.0]


class SandboxSleep:
    """Sleeps `seconds` in the code sandbox (isolation `level`, workdirs under `tmp`), far from its wall
    limit, with a child that left its session sleeping too; the sandbox is built in setup(), as a code
    task's is when its worker starts."""

    name = "sandbox_sleep"

    def __init__(self, level: str, tmp: str) -> None:
        self.level, self.tmp = level, tmp

    def setup(self) -> None:
        import tempfile

        from streamrl.rewards.sandbox import LocalSandbox

        tempfile.tempdir = self.tmp
        self.box = LocalSandbox(isolation=self.level, min_isolation="rlimits")

    def __call__(self, seconds: float) -> float:
        from streamrl.rewards.sandbox import Limits

        program = f"import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep({seconds})\n"
        return float(self.box.run(program, "", Limits(wall_s=120.0)).ok)
