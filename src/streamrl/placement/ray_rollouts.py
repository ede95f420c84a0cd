"""runtime.backend=ray: rollout workers as Ray actors, exactly-once when an actor dies.

The controller (the admission thread of AsyncRunner) keeps one `exchange` call in flight per actor:
it carries the requests assigned to that actor and returns its finished groups and its incarnation
(a fresh id per actor start). It knows which group ids each actor holds; when a call fails with
RayActorError, or a reply comes from a new incarnation (the actor died between two calls and Ray ran
the next call on its restart), the groups the old incarnation held go back to
the least-loaded live actors (Ray restarts the actor up to ray.max_restarts times; after that its slot
is retired). The runner drops a result whose group already returned (loop/asynchronous.py), so a
group is trained at most once and none is lost. Actor restarts and re-dispatched groups are counted
in the step records (actor_restarts, groups_redispatched). Each actor's stderr is appended to the run
directory's rollout-worker<i>.log, as a local worker's is (placement/ray_actor.py, worker_log.py).

Weights: object_store or broadcast (placement/weight_sync.py). Broadcast refuses restarts (config
validation): a torch.distributed group cannot admit a new member, so a dead actor stops the run with
that reason instead of a hang.

Seam for data-parallel trainers: the single trainer rank runs in the driver. Trainer ranks > 0 would
be Ray actors reserving ray.trainer_cpus / ray.trainer_gpus, and rank 0 stays the weight publisher.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Set
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from streamrl.brief import brief, brief_error
from streamrl.config import Config, to_dict
from streamrl.config_validate import resolved_weight_sync
from streamrl.placement.ray_actor import ACTOR_STATE_WAIT_S, RolloutActor, actor_states
from streamrl.placement.weight_sync import (
    BroadcastPublisher,
    FlatLayout,
    ObjectStorePublisher,
    WeightSyncError,
)
from streamrl.placement.worker_log import create_logs, incarnation_tail, log_path
from streamrl.rollout.worker import GroupRequest, GroupResult

POLL_WAIT_S = 0.05  # an actor holds an exchange call this long when it has nothing finished


def ensure_ray(cfg: Config) -> bool:
    """Connect to ray.address or start a local instance; True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with _handlers_kept():
        if cfg.ray.address:
            ray.init(address=cfg.ray.address, logging_level="warning")
        else:  # temp and log files under ray_temp_dir(), no dashboard
            ray.init(
                num_cpus=cfg.ray.num_cpus or None,
                include_dashboard=False,
                logging_level="warning",
                _temp_dir=ray_temp_dir(),
            )
    return True


@contextmanager
def _handlers_kept() -> Iterator[None]:
    """The caller's SIGINT and SIGTERM handlers, put back after ray.init: it replaces the SIGTERM one with
    its own, which ends the local instance and exits at once, and installs a C-level one that logs the
    signal, so a run's SIGTERM would not stop it at a safe point with its state saved (loop/signals.py).
    A signal left at its default action keeps Ray's handler, which at least ends the instance."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python signal handlers are the main thread's (ray.init does not set them elsewhere)
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if callable(handler):  # Python's C-level handler comes back with it
                signal.signal(sig, handler)


def ray_temp_dir() -> str:
    """Root of a local Ray instance's temp and log files: $RAY_TMPDIR/ray (Ray's own variable), else
    /tmp/ray. Ray itself would fall back to $TMPDIR, whose long paths can exceed the ~107-byte limit
    of the unix sockets it creates there."""
    return os.path.join(os.environ.get("RAY_TMPDIR") or "/tmp", "ray")


def check_resources(cfg: Config, cluster: dict[str, float]) -> None:
    """Actors that do not fit would wait for resources forever: say so before creating them."""
    n, r = cfg.runtime.rollout_workers, cfg.ray
    for key, per, have in (
        ("rollout_cpus", r.rollout_cpus, cluster.get("CPU", 0.0)),
        ("rollout_gpus", r.rollout_gpus, cluster.get("GPU", 0.0)),
    ):
        if n * per > have:
            raise RuntimeError(
                f"ray: {n} rollout actors x ray.{key}={per:g} need {n * per:g} but the cluster has "
                f"{have:g}: lower ray.{key} (fractions are fine) or runtime.rollout_workers, or add nodes"
            )


class RayRollouts:
    def __init__(self, cfg: Config) -> None:
        self.cfg, self.n = cfg, cfg.runtime.rollout_workers
        self.mode = resolved_weight_sync(cfg)
        self.timeout = cfg.runtime.sync_timeout_s
        self.started_ray = False
        self.actors: list[Any] = []
        self.pending: dict[Any, tuple[int, set[str]]] = {}  # exchange ref -> (slot, group ids it carries)
        self.incarnation: list[str | None] = [None] * self.n  # None: the next reply sets it (start, death)
        self.held: list[dict[str, GroupRequest]] = [{} for _ in range(self.n)]  # sent, not returned
        self.outbox: list[list[GroupRequest]] = [[] for _ in range(self.n)]  # assigned, not yet sent
        self.orphans: list[GroupRequest] = []  # no live actor to take them
        self.deaths = [0] * self.n
        self.retired: set[int] = set()
        self.restarts = self.redispatched = 0
        self.fatal: str | None = None
        self.events: list[str] = []  # deaths and re-dispatches, for the log and for tests
        self.publisher: Any = None
        self._lock = threading.Lock()  # announcements: trainer thread (publish) vs admission (restart)

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self, state: dict[str, torch.Tensor], version: int) -> None:
        import ray

        self.started_ray = ensure_ray(self.cfg)
        check_resources(self.cfg, ray.cluster_resources())
        create_logs(self.cfg.run_dir, self.n)  # an actor that can open its log keeps its stderr there
        r = self.cfg.ray
        options: dict[str, Any] = dict(
            num_cpus=r.rollout_cpus, num_gpus=r.rollout_gpus, max_restarts=r.max_restarts, max_task_retries=0
        )
        if r.address and "STREAMRL_CACHE" in os.environ:  # a joined cluster does not inherit our env
            options["runtime_env"] = {"env_vars": {"STREAMRL_CACHE": os.environ["STREAMRL_CACHE"]}}
        actor_cls = ray.remote(RolloutActor).options(**options)
        cfg_dict = to_dict(self.cfg)
        if self.mode == "broadcast":
            backend = "nccl" if self.cfg.device.startswith("cuda") else "gloo"
            self.publisher = BroadcastPublisher(self.n, self.timeout, backend)
            host, port = self.publisher.address()
            base = dict(mode="broadcast", host=host, port=port, world=self.n + 1, backend=backend, epoch=0)
            base["layout"] = FlatLayout.of(state)
            self.actors = [actor_cls.remote(i, cfg_dict, {**base, "rank": i + 1}) for i in range(self.n)]
            try:
                self.publisher.connect()  # blocks until every actor joined, or raises after the timeout
            except WeightSyncError as e:
                raise WeightSyncError(f"{e}; {actor_states(self.actors, ACTOR_STATE_WAIT_S)}") from e
        else:
            self.publisher = ObjectStorePublisher()
            self.actors = [actor_cls.remote(i, cfg_dict, {"mode": "object_store"}) for i in range(self.n)]
        self.publish(state, version)
        for slot in range(self.n):
            self._exchange(slot)

    def wait_ready(self, timeout: float) -> bool:
        """Ray actors are not waited for: their start counts in the loop's time."""
        return True

    def trainer_threads(self) -> None:
        """Actors reserve their own CPUs (ray.rollout_cpus): nothing is lent."""
        return None

    def stop(self) -> list[GroupResult]:
        """Collect what the actors finished, stop them, and end Ray if this run started it."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        out: list[GroupResult] = []
        live = [s for s in range(self.n) if s not in self.retired and s < len(self.actors)]
        exchanges = list(self.pending)
        stops = [self.actors[s].stop.remote() for s in live]
        self.pending.clear()
        for ref in exchanges + stops:  # a dead actor's groups stay in the runner's in-flight set: carried
            try:
                got = ray.get(ref, timeout=60)
            except (RayActorError, GetTimeoutError):
                continue
            out.extend(got[1] if ref in exchanges else got)
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
        if self.started_ray:
            ray.shutdown()
        return out

    # ---- requests and results (admission thread) ------------------------------------------------
    def _live(self) -> list[int]:
        return [s for s in range(self.n) if s not in self.retired]

    def submit(self, req: GroupRequest) -> None:
        live = self._live()
        if not live:
            self.orphans.append(req)
            return
        slot = min(live, key=lambda s: len(self.held[s]) + len(self.outbox[s]))
        self.outbox[slot].append(req)

    def resend(self, req: GroupRequest, elsewhere: bool = False) -> None:
        gid = req.group_id
        if any(r.group_id == gid for box in [*self.outbox, self.orphans] for r in box):
            return  # not sent yet: the copy waiting to go is the one
        live = self._live()
        holder = next((s for s in live if gid in self.held[s]), None)
        others = [s for s in live if s != holder]
        if holder is None or (elsewhere and others):
            slot = min(others, key=lambda s: len(self.held[s]) + len(self.outbox[s]), default=None)
            if slot is None:  # no live actor
                self.orphans.append(req)
            else:
                self.outbox[slot].append(req)
        else:
            self.outbox[holder].append(req)

    def _exchange(self, slot: int) -> None:
        reqs, self.outbox[slot] = self.outbox[slot], []
        for r in reqs:
            self.held[slot][r.group_id] = r
        ref = self.actors[slot].exchange.remote(reqs, POLL_WAIT_S)
        self.pending[ref] = (slot, {r.group_id for r in reqs})

    def poll(self, timeout: float) -> list[GroupResult]:
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        if not self.pending:
            time.sleep(timeout)
            return []
        ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=timeout)
        results: list[GroupResult] = []
        for ref in ready:
            slot, sent = self.pending.pop(ref)
            try:
                incarnation, got = ray.get(ref)
            except ActorUnavailableError as e:  # unreachable for now, perhaps alive: re-dispatch, no death
                n = len(self._lost(slot))
                said = brief(str(e), 80)
                self.events.append(f"actor {slot} unavailable ({said}); {n} groups re-dispatched")
                self._redispatch(slot)
                self._exchange(slot)
                continue
            except RayActorError as e:
                self._on_death(slot, e, dead=self.incarnation[slot])
                continue
            if self.incarnation[slot] is None:
                self.incarnation[slot] = incarnation
            elif incarnation != self.incarnation[slot]:  # died between calls; this call ran on its restart
                dead, self.incarnation[slot] = self.incarnation[slot], incarnation
                restarted = RuntimeError("restarted between two calls")
                self._on_death(slot, restarted, keep=sent, failed_call=False, dead=dead)
            for res in got:  # returned: no slot needs to regenerate it any more
                for held in self.held:
                    held.pop(res.group_id, None)
            results.extend(got)
            self._exchange(slot)
        return results

    def _redispatch(self, slot: int, keep: Set[str] = frozenset()) -> None:
        """The slot's groups (but `keep`: delivered to its new incarnation) go to the least-loaded live
        actors; a late copy of a group is dropped by the runner."""
        lost = self._lost(slot, keep)
        self.held[slot] = {g: r for g, r in self.held[slot].items() if g in keep}
        self.outbox[slot] = []
        self.redispatched += len(lost)
        for req in lost:
            self.submit(req)

    def _lost(self, slot: int, keep: Set[str] = frozenset()) -> list[GroupRequest]:
        """The slot's groups, held or waiting in its outbox (a copy sent again can be in both), each once,
        but `keep`."""
        reqs = {g: r for g, r in self.held[slot].items() if g not in keep}
        for r in self.outbox[slot]:
            if r.group_id not in keep:
                reqs.setdefault(r.group_id, r)
        return list(reqs.values())

    def _on_death(
        self,
        slot: int,
        err: Exception,
        keep: Set[str] = frozenset(),
        failed_call: bool = True,
        dead: str | None = None,
    ) -> None:
        """`keep`: group ids the restarted actor already has (they are not re-dispatched). failed_call:
        the death was seen by a call that failed (the next call is made here); False: by a reply from
        the new incarnation (the caller makes the next call). `dead`: the dead incarnation's id (None
        before its first reply), whose stderr tail the event and the console line quote."""
        self.deaths[slot] += 1
        n_lost = len(self._lost(slot, keep))
        cause = brief_error(err, 200, first_line=True)
        said = self._stderr_tail(slot, dead)
        if self.mode == "broadcast":
            self.fatal = (
                f"rollout actor {slot} died ({cause}); runtime.weight_sync=broadcast cannot admit a "
                "restarted actor into its group: use runtime.weight_sync=object_store to survive actor deaths"
                f"{said}"
            )
        if self.deaths[slot] > self.cfg.ray.max_restarts:
            self.retired.add(slot)  # Ray will not restart it again
        if not self._live():
            self.fatal = self.fatal or (
                f"all {self.n} rollout actors died (ray.max_restarts={self.cfg.ray.max_restarts} each); "
                f"last: {cause}{said}"
            )
        what = (
            "retired"
            if slot in self.retired
            else f"restarted ({self.deaths[slot]} of {self.cfg.ray.max_restarts})"
        )
        event = f"rollout actor {slot} died ({cause}); {what}, {n_lost} group(s) re-dispatched{said}"
        self.events.append(event)
        print(f"streamrl: {event}", file=sys.stderr, flush=True)
        self._redispatch(slot, keep)
        if slot not in self.retired:
            self.restarts += 1
            with self._lock:  # the restarted actor starts without weights: announce the newest
                if self.mode == "object_store":
                    self.actors[slot].announce.remote(*self.publisher.announcement())
            if failed_call:  # no call in flight to the slot: the next one finds the new incarnation
                self.incarnation[slot] = None
                self._exchange(slot)

    def _stderr_tail(self, slot: int, dead: str | None) -> str:
        """ "; its stderr ended: ..." from the run directory's log of the slot, or "" when there is none
        (no run directory, or the actor died before its first reply)."""
        if not self.cfg.run_dir or dead is None:
            return ""
        return f"; its stderr ended: {incarnation_tail(log_path(Path(self.cfg.run_dir), slot), dead)}"

    def failure(self) -> str | None:
        return self.fatal

    def stats(self) -> dict[str, int]:
        return {
            "actor_restarts": self.restarts,
            "groups_redispatched": self.redispatched,
            "rollout_actors_live": len(self._live()),
        }

    def held_by(self, slot: int) -> list[str]:
        """Group ids the actor in `slot` is generating (sent, not returned)."""
        return list(self.held[slot])

    # ---- weights (trainer thread) ---------------------------------------------------------------
    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        if self.fatal:
            raise RuntimeError(self.fatal)
        with self._lock:
            if self.mode == "object_store":
                self.publisher.publish(state, version)
                for s in self._live():  # fire and forget: a dead actor is re-announced when it restarts
                    self.actors[s].announce.remote(*self.publisher.announcement())
                return
            for s in self._live():  # every member joins this version's collectives
                self.actors[s].announce.remote(version)
        self.publisher.publish(state, version)
