"""Bounded staleness by admission control (AReaL): one formula, one small thread-safe class.

With trainer version v, batch size B (in groups) and bound eta, a new group is admitted only while

    accepted + running < (min(eta, v) + v + 1) * B

where `running` counts admitted groups not yet returned and `accepted` counts every group returned and
kept (trained or waiting in the buffer). eta = 0 admits exactly one batch per version: synchronous RL.
The lead ramps up: the base policy generates one batch only, and each step lets the workers run one
batch further ahead until they are eta ahead. So the first step is synchronous, and the base policy's
answers (the longest, and the ones that change fastest) are not generated for eta batches that would
train on them eta steps late; with eta = 1 the ramp changes version 0 only.
A group that comes back rejected (filtered) frees its slot. On resume the counters are rebased on the
restored version (AReaL issue #1388: resetting them to 0 lets a resumed run admit far too much).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass


@dataclass
class StalenessState:
    version: int = 0
    accepted: int = 0
    running: int = 0


class StalenessManager:
    def __init__(self, batch_groups: int, max_staleness: int, state: StalenessState | None = None) -> None:
        if batch_groups <= 0 or max_staleness < 0:
            raise ValueError(
                f"need batch_groups > 0 and max_staleness >= 0, got {batch_groups}, {max_staleness}"
            )
        self.B = batch_groups
        self.eta = max_staleness
        self.state = state or StalenessState()
        self._lock = threading.Lock()

    def _limit(self) -> int:
        v = self.state.version
        return (min(self.eta, v) + v + 1) * self.B

    def capacity(self) -> int:
        """How many more groups may be admitted now."""
        with self._lock:
            s = self.state
            return max(0, self._limit() - (s.accepted + s.running))

    def try_admit(self) -> bool:
        with self._lock:
            s = self.state
            if s.accepted + s.running >= self._limit():
                return False
            s.running += 1
            return True

    def on_return(self, kept: bool) -> None:
        with self._lock:
            if self.state.running <= 0:
                raise RuntimeError("a group returned that was never admitted")
            self.state.running -= 1
            self.state.accepted += int(kept)

    def release_accepted(self) -> None:
        """A kept group was dropped later (e.g. too stale to train): free its slot."""
        with self._lock:
            if self.state.accepted <= 0:
                raise RuntimeError("release_accepted with no accepted group")
            self.state.accepted -= 1

    def set_version(self, version: int) -> None:
        with self._lock:
            self.state.version = version

    def state_dict(self) -> dict[str, int]:
        with self._lock:
            return asdict(self.state)

    @classmethod
    def resumed(
        cls, batch_groups: int, max_staleness: int, version: int, buffered: int, running: int
    ) -> StalenessManager:
        """Counters rebased on a restored run: version*B groups were trained, `buffered` wait in the
        buffer and `running` carried-over groups are re-submitted."""
        state = StalenessState(version=version, accepted=version * batch_groups + buffered, running=running)
        return cls(batch_groups, max_staleness, state)


def next_in_batch(
    oldest: Sequence[int], running: Iterable[int], version: int, eta: int, room: int
) -> int | None:
    """Which finished group a batch with `room` places left takes next, or None to wait for one.

    oldest: each finished group's oldest token version, in the order they finished. running: the
    version each group still generating was admitted under (a lower bound on its tokens'). A group is
    due when this step is its last within the bound (oldest <= version - eta). Due groups come first,
    and while at least `room` due groups are still generating the batch waits for them rather than
    fill up with fresher groups that finished sooner, which would leave them to come back too stale.
    With eta <= 1 at most B groups are due at once (those admitted under versions up to v - eta number
    at most (v + 1) * B kept ones, v * B of which are trained), so none is thrown away. The rest of the
    batch is the oldest, then the first finished."""
    if not oldest:
        return None
    due = version - eta
    best = min(range(len(oldest)), key=lambda i: (oldest[i], i))
    if oldest[best] > due and sum(a <= due for a in running) >= room:
        return None
    return best
