"""Turn a hang into a test failure without asserting on speed (tests/ is on sys.path).

`call_bounded(fn, limit_s, hang)` runs fn in a daemon thread and returns its result or re-raises its
exception in the caller, so `pytest.raises` works around it. If fn is still running after limit_s the
test fails with `hang` as the message. limit_s is a generous bound far above any normal duration,
there only so that a broken timeout ends the test instead of blocking it: the tests assert what fn
did (its error, its result, what a stand-in saw), never how fast it was. `wait_until` (failing) and
`eventually` (returning a bool) are the same bound for a condition another thread or process makes true.
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


def eventually(cond: Callable[[], bool], limit_s: float, poll_s: float = 0.01) -> bool:
    """Poll cond until it holds (True) or limit_s passes (False). For callbacks that must not raise:
    the test asserts the result afterwards."""
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def wait_until(cond: Callable[[], bool], limit_s: float, hang: str, poll_s: float = 0.01) -> None:
    """Poll cond until it holds; fail the test with `hang` if it still does not after limit_s."""
    if not eventually(cond, limit_s, poll_s):
        pytest.fail(f"not the case after {limit_s:g} s: {hang}", pytrace=False)
