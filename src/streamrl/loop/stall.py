"""A wait for groups that never come back: the trainer waits, groups are in flight, none has come back.

A worker that dies or stops beating is restarted and its groups re-sent (placement/backend.py). A group
lost inside a live worker (a bug in its engine, say) would leave the trainer waiting for it forever. So
once the trainer has waited `limit_s` with groups in flight and none has come back meanwhile, the groups
still in flight are sent again, with one warning line, each to the worker that holds it
(`RolloutBackend.resend`): a worker that still generates the group ignores the copy, one that lost it
generates it again. A group sent again that is still in flight at the next firing is stuck in its
worker (an agent's call that never returns, say): that copy goes to another worker, if there is one.
Should two results come back, the first counts and the later one is dropped as a duplicate
(`duplicate_results`), as when a dead actor's groups are re-dispatched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any


class StallWatch:
    """limit_s: seconds the trainer may wait, with groups in flight and none coming back, before they
    are sent again. Not thread-safe: its caller holds the runner's lock."""

    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s, self.clock = limit_s, clock
        self.last_return = clock()
        self.waiting_since: float | None = None  # the trainer's current wait for a batch began
        self.resent = 0  # groups sent again, in all
        self.sent: set[str] = set()  # the groups sent again at the last firing
        self.repeated: set[str] = set()  # of those, the ones still in flight at this firing: stuck

    def returned(self) -> None:
        """A group came back."""
        self.last_return = self.clock()

    def waiting(self, yes: bool) -> None:
        """The trainer begins (or ends) waiting for its batch."""
        if not yes:
            self.waiting_since = None
        elif self.waiting_since is None:
            self.waiting_since = self.clock()

    def due(self, inflight: Mapping[str, Any]) -> tuple[list[Any], str | None]:
        """inflight: group id -> request. The requests to send again and the warning line, or ([], None).
        The quiet time counts from the later of the last return and the start of the trainer's wait, and
        starts again once they are sent."""
        if self.waiting_since is None or not inflight:
            return [], None
        now = self.clock()
        quiet = now - max(self.last_return, self.waiting_since)
        if quiet < self.limit_s:
            return [], None
        self.last_return = now
        again = list(inflight.values())
        self.resent += len(again)
        self.repeated = self.sent & inflight.keys()
        self.sent = set(inflight)
        line = (
            f"streamrl: warning: the trainer has waited {quiet:.0f} s and none of the {len(again)} "
            f"group(s) in flight has come back ({_ids(again)}), though the rollout workers are alive; they "
            f"are sent again (runtime.worker_timeout_s={self.limit_s:g})"
        )
        if self.repeated:
            stuck = [r for r in again if r.group_id in self.repeated]
            line += f"; {_ids(stuck)} sent before: to another worker, if there is one"
        return again, line


def _ids(reqs: list[Any]) -> str:
    return ", ".join(r.group_id for r in reqs[:5]) + (", ..." if len(reqs) > 5 else "")
