"""Graceful stop: the first Ctrl-C or SIGTERM asks the run to stop at the next safe point (between
optimizer steps, so a step is never half applied), where it saves its state; it says so at once. Later
ones are refused with a message until that save is done: interrupting it could only lose work, while a
kill -9 leaves the newest complete state in RUN_DIR/state intact."""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

REFUSED = (
    "streamrl: already stopping; the state is being saved. Wait for it, or kill -9 the run: the newest "
    "complete state in RUN_DIR/state stays intact"
)
STOPPING = "streamrl: {signal}: stopping after this step, then saving the state (a second one is refused)"


def _say(line: str) -> None:
    """One line on stderr from a signal handler: a raw write, as the interrupted code may be halfway
    through a buffered print (printing again there raises 'reentrant call')."""
    try:
        os.write(sys.stderr.fileno(), (line + "\n").encode())
    except (AttributeError, OSError, ValueError):  # a notebook's stderr has no file descriptor
        print(line, file=sys.stderr, flush=True)


class StopFlag:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""
        self._previous: dict[int, Any] = {}  # the handlers install() replaced, put back by uninstall()

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.event.set()

    def __bool__(self) -> bool:
        return self.event.is_set()

    def install(self) -> None:
        """Route SIGINT/SIGTERM to this flag (main thread only)."""

        def handler(signum: int, frame: FrameType | None) -> None:
            if self.event.is_set():
                _say(REFUSED)
                return
            self.request(signal.Signals(signum).name)
            _say(STOPPING.format(signal=signal.Signals(signum).name))

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, handler)

    def uninstall(self) -> None:
        """Put back the handlers install() replaced (a notebook's Ctrl-C works again after the run)."""
        while self._previous:
            sig, previous = self._previous.popitem()
            signal.signal(sig, previous)
