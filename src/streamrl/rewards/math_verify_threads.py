"""math-verify in the threads your reward functions run on.

math-verify bounds `parse`, `verify` and `math_metric` with SIGALRM, which Python allows in the main
thread only: in any other thread, with their default timeouts, they raise ValueError ("Math-Verify
'parse' function doesn't support threaded environment ..."). Your reward functions run on the reward
service's threads (reward.service=thread, the default) and async ones on an event loop's thread, so a
function written as open-r1's (`from math_verify import parse, verify` with their defaults) would fail
on every sample.

`allow_in_threads` makes math-verify's timeout thread-aware: in the main thread it is math-verify's own
(a reward process's worker, reward.service=process, runs your functions there); in any other thread,
where that one can only raise, a call runs without it and the service's reward.timeout_s bounds the
score instead. streamrl's own checker (rewards/math.py) and TRL's accuracy rewards do the same by
passing no timeout off the main thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

_installed = False
_lock = threading.Lock()


def allow_in_threads() -> None:
    """Make math-verify's parse and verify callable from any thread of this process (idempotent; a
    no-op without math-verify, and off POSIX, where its timeout runs in a process of its own)."""
    global _installed
    with _lock:
        if _installed or os.name != "posix":
            return
        try:
            import math_verify.grader as grader
            import math_verify.metric as metric
            import math_verify.parser as parser
        except ImportError:
            return
        for module in (parser, grader, metric):  # each calls its own `timeout` name at every call
            original = getattr(module, "timeout", None)
            if callable(original):
                module.timeout = _thread_aware(original)  # type: ignore[attr-defined]
        _installed = True


def _thread_aware(original: Callable[..., Any]) -> Callable[..., Any]:
    """math-verify's `timeout(timeout_seconds)` decorator factory, with no timeout off the main thread."""

    def timeout(timeout_seconds: int | None = 10) -> Any:
        if threading.current_thread() is threading.main_thread():
            return original(timeout_seconds)
        return original(None)

    timeout.__wrapped__ = original  # type: ignore[attr-defined]
    return timeout
