"""What the asynchronous loop's admission thread and trainer thread share, guarded by one condition
(`Shared.cond`); `LoopParts` gathers the pieces both hold."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamrl.loop.dynamic_sampling import DynamicSampling
    from streamrl.loop.episode_errors import EpisodeErrors
    from streamrl.loop.ledger import Ledger
    from streamrl.loop.staleness import StalenessManager
    from streamrl.loop.stall import StallWatch
    from streamrl.loop.state import RunState
    from streamrl.placement.backend import RolloutBackend
    from streamrl.rollout.drafts import DraftStore
    from streamrl.types import Problem

# event counters a step record carries for the whole run: the loop's and the backend's (stats())
RUN_COUNTERS = (
    "duplicate_results",
    "groups_resent",
    "worker_restarts",
    "actor_restarts",
    "groups_redispatched",
)


class RunCounters:
    """The run's event counters (RUN_COUNTERS): this process's (the loop's own, the backend's stats())
    continued from `before`, the saved state's, so a resumed run's records count the whole run."""

    def __init__(self, before: dict[str, int]) -> None:
        self.before = dict(before)
        self.backend: dict[str, Any] = {}  # the backend's statistics at the last step

    def step(self, stats: dict[str, Any], duplicates: int, resent: int) -> dict[str, Any]:
        """A step record's backend statistics with the run's counters."""
        self.backend = stats
        return {**stats, **self.total(duplicates, resent)}

    def refresh(self, backend: Any) -> None:
        """The backend's statistics as they are now (a stop: restarts since the last step count); the
        last step's if reading them fails. Called outside every lock the workers' supervision needs."""
        try:
            self.backend = backend.stats()
        except Exception:  # the stop's save and carry-over must not fail over a statistic
            pass

    def total(self, duplicates: int, resent: int) -> dict[str, int]:
        """The counters for the state, the backend's as of the last step or `refresh`."""
        stats = self.backend
        now = {"duplicate_results": duplicates, "groups_resent": resent, **stats}
        return {
            k: self.before.get(k, 0) + int(now.get(k, 0))
            for k in RUN_COUNTERS
            if k in now or k in self.before
        }


@dataclass
class Shared:
    """The buffer of returned groups, the requests in flight, errors to raise in the trainer thread and
    the rollout workers' cumulative counters (guarded by `cond`)."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    buffer: deque[Any] = field(default_factory=deque)  # GroupResult, oldest first
    inflight: dict[str, Any] = field(default_factory=dict)  # group id -> GroupRequest
    errors: list[str] = field(default_factory=list)
    duplicates: int = 0  # results of a group already returned (e.g. re-generated after an actor died)
    busy: float = 0.0
    idle: float = 0.0
    generated: int = 0  # tokens the rollout workers sampled (GroupResult.tokens): kept and dropped groups'
    rows: int = 0  # sequences the workers' engines decoded, summed over decode steps (GroupResult.rows)
    cache_rows: int = 0  # the KV-cache rows forwarded for them (GroupResult.cache_rows)

    @classmethod
    def resumed(cls, engine: dict[str, float]) -> Shared:
        """Empty, with the workers' counters continuing from a saved state's `engine_counters()`."""
        sh = cls()
        sh.busy, sh.idle = engine.get("busy_s", 0.0), engine.get("idle_s", 0.0)
        sh.generated = int(engine.get("tokens", 0))
        sh.rows, sh.cache_rows = int(engine.get("rows", 0)), int(engine.get("cache_rows", 0))
        return sh

    def engine_counters(self) -> dict[str, float]:
        return {
            "busy_s": self.busy,
            "idle_s": self.idle,
            "tokens": self.generated,
            "rows": self.rows,
            "cache_rows": self.cache_rows,
        }


@dataclass(frozen=True)
class LoopParts:
    """The pieces the asynchronous loop's trainer side (loop/asynchronous.py) builds and its admission
    thread (loop/admission.py) uses too: `sh.cond` guards all of them but the staleness manager, which
    has its own lock, and the backend, which is called outside it."""

    sh: Shared
    state: RunState  # its draw counters and unfinished requests
    stream: Iterator[Problem]  # the training problems, drawn by the admission thread
    backend: RolloutBackend
    ledger: Ledger
    staleness: StalenessManager
    stall: StallWatch  # groups that never come back
    sampling: DynamicSampling  # the dynamic-sampling filter
    episode_errors: EpisodeErrors
    drafts: DraftStore | None  # speculative rollouts' drafts, if on
