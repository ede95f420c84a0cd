"""Where rollout workers run, behind one small interface the AsyncRunner drives.

The runner owns admission, staleness, the buffer and the ledger; a backend only moves requests to
workers, results back and weights out. LocalRollouts: spawned processes, mp queues and SharedWeights.
RayRollouts (placement/ray_rollouts.py): Ray actors, exactly-once re-dispatch when an actor dies, and
object-store or broadcast weight sync.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from streamrl.config import Config, to_dict
from streamrl.placement.shared_weights import SharedWeights
from streamrl.rollout.worker import STOP, GroupRequest, GroupResult


class RolloutBackend(Protocol):
    def start(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Start the workers; they begin on these weights."""

    def submit(self, req: GroupRequest) -> None:
        """Hand one admitted group to some worker (called by the admission thread only)."""

    def poll(self, timeout: float) -> list[GroupResult]:
        """Finished groups, waiting at most about `timeout` s (admission thread only)."""

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """New weights to every worker (trainer thread); raises rather than hang past the sync timeout."""

    def failure(self) -> str | None:
        """Why the workers cannot go on (all dead), or None."""

    def stats(self) -> dict[str, int]:
        """Counters for the step record (e.g. actor restarts, groups re-dispatched)."""

    def stop(self) -> list[GroupResult]:
        """Stop the workers; returns results that finished meanwhile (kept, not lost)."""


class LocalRollouts:
    """Rollout workers as spawned processes on this machine; weights through shared memory."""

    def __init__(self, cfg: Config, worker_target: Callable[..., None]) -> None:
        self.cfg, self.worker_target = cfg, worker_target
        self.ctx = mp.get_context("spawn")
        self.requests, self.results = self.ctx.Queue(), self.ctx.Queue()
        self.procs: list[Any] = []
        self.weights: SharedWeights | None = None

    def start(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.weights = SharedWeights(state, self.ctx)
        self.weights.publish(state, version)
        cfg, threads = self.cfg, self.cfg.runtime.rollout_threads
        self.procs = [
            self.ctx.Process(
                target=self.worker_target,
                args=(i, to_dict(cfg), self.requests, self.results, self.weights, threads),
                daemon=True,
            )
            for i in range(cfg.runtime.rollout_workers)
        ]
        for p in self.procs:
            p.start()

    def submit(self, req: GroupRequest) -> None:
        self.requests.put(req)

    def poll(self, timeout: float) -> list[GroupResult]:
        try:
            return [self.results.get(timeout=timeout)]
        except queue.Empty:
            return []

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        assert self.weights is not None, "start() first"
        self.weights.publish(state, version)

    def failure(self) -> str | None:
        if all(p.is_alive() for p in self.procs):
            return None
        return "a rollout worker died; see its error above"

    def stats(self) -> dict[str, int]:
        return {}

    def stop(self) -> list[GroupResult]:
        for _ in self.procs:
            self.requests.put(STOP)
        deadline = time.monotonic() + 30
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
        out = []
        while True:  # results that arrived while stopping are finished groups: keep them
            try:
                out.append(self.results.get(timeout=0.2))
            except queue.Empty:
                break
        self.requests.cancel_join_thread()
        self.results.cancel_join_thread()
        return out


def make_backend(cfg: Config, worker_target: Callable[..., None]) -> RolloutBackend:
    if cfg.runtime.backend == "ray":
        from streamrl.placement.ray_rollouts import RayRollouts

        return RayRollouts(cfg)
    return LocalRollouts(cfg, worker_target)
