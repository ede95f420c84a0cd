"""Turn a hang into a test failure without asserting on speed (tests/ is on sys.path).

`call_bounded(fn, limit_s, hang)` runs fn in a daemon thread and returns its result or re-raises its
exception in the caller, so `pytest.raises` works around it. If fn is still running after limit_s the
test fails with `hang` as the message. limit_s is a generous bound far above any normal duration,
there only so that a broken timeout ends the test instead of blocking it: the tests assert what fn
did (its error, its result, what a stand-in saw), never how fast it was. `wait_until` is the same
bound for a condition that some other thread or process makes true.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def call_bounded(fn: Callable[[], T], limit_s: float, hang: str) -> T:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    worker = threading.Thread(target=run, name="call-bounded", daemon=True)
    worker.start()
    worker.join(limit_s)
    if worker.is_alive():
        pytest.fail(f"still running after {limit_s:g} s: {hang}", pytrace=False)
    if "error" in box:
        raise box["error"]
    return box["result"]


def wait_until(cond: Callable[[], bool], limit_s: float, hang: str, poll_s: float = 0.01) -> None:
    """Poll cond until it holds; fail the test with `hang` if it still does not after limit_s."""
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"not the case after {limit_s:g} s: {hang}", pytrace=False)
        time.sleep(poll_s)
