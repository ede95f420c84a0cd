"""Graceful stop: the first Ctrl-C or SIGTERM asks the run to stop at the next safe point; a second
Ctrl-C interrupts at once. Safe points are between optimizer steps, so a step is never half applied."""

from __future__ import annotations

import signal
import threading
from types import FrameType


class StopFlag:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.event.set()

    def __bool__(self) -> bool:
        return self.event.is_set()

    def install(self) -> None:
        """Route SIGINT/SIGTERM to this flag (main thread only)."""

        def handler(signum: int, frame: FrameType | None) -> None:
            if self.event.is_set() and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.request(signal.Signals(signum).name)

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, handler)
            signal.signal(signal.SIGTERM, handler)
