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


def sleepy(seconds: float, value: float) -> float:
    time.sleep(seconds)
    return value


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
    Path(path).write_text(str(os.getpid()))
    time.sleep(seconds)
    return 1.0
