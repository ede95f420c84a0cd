"""A rollout worker as a Ray actor: the same generation loop as a local worker (worker.serve), fed by a
thread queue, emptied through an outbox, with weights from the object store or a broadcast group.

The loop runs in a thread of the actor; the controller talks to the actor by method calls that run in
the actor's main thread: `exchange` (hand over requests, take finished groups), `announce` (new weights
exist), `stop`. Ray wraps this plain class with ray.remote in placement/ray_rollouts.py.

Its stderr goes to the run directory's rollout-worker<i>.log as a local worker's does (the first thing
its __init__ does, placement/worker_log.py), so a reward function's failure, the reward service's
first-failure warning and a traceback are kept with the run, and stay off the driver's console, where
the trainer prints each kind of failure's first message itself, as with the local backend. Ray's own
options were weighed: ray.init(log_to_driver=False) acts on every actor's stdout and stderr at once
(a reward function's print would vanish too) and keeps nothing in the run directory, and neither
runtime_env nor ray.LoggingConfig can send one actor's stderr to a chosen file (Ray names its worker
logs by worker id and pid, under its session directory). What an actor writes before its __init__
runs (unpickling this class, importing streamrl) stays in Ray's session logs, printed on the driver's
console. Its stdout is left to Ray (printed on the driver's console, prefixed), as a local worker's
goes to the trainer's console.

`actor_states` is the driver's view of its actors when the weight group cannot form: each one not
started (pending resources), dead (with what its __init__ raised) or up (joined or not).
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from streamrl.brief import brief
from streamrl.placement.worker_log import keep_stderr
from streamrl.rollout.worker import STOP, GroupRequest, GroupResult, serve


def make_receiver(sync: dict[str, Any], timeout: float) -> Any:
    """sync: {"mode": "object_store"} or
    {"mode": "broadcast", host, port, rank, world, layout, backend, epoch}."""
    from streamrl.placement.weight_sync import BroadcastReceiver, ObjectStoreReceiver

    if sync["mode"] == "object_store":
        return ObjectStoreReceiver(timeout)
    return BroadcastReceiver(
        sync["layout"],
        sync["host"],
        sync["port"],
        sync["rank"],
        sync["world"],
        timeout,
        sync["backend"],
        sync["epoch"],
    )


class RolloutActor:
    def __init__(self, worker_id: int, cfg_dict: dict[str, Any], sync: dict[str, Any]) -> None:
        import uuid

        self.incarnation = uuid.uuid4().hex  # new after every restart: the controller sees the death
        run_dir = str(cfg_dict.get("run_dir") or "")
        self.log = keep_stderr(run_dir, worker_id, self.incarnation)  # None: Ray's logs keep it
        import torch

        torch.set_num_threads(int(cfg_dict["runtime"]["rollout_threads"]))
        self.worker_id = worker_id
        self.requests: queue.Queue[Any] = queue.Queue()
        self.outbox: queue.Queue[GroupResult] = queue.Queue()
        self.stopped = threading.Event()
        self.weights = make_receiver(sync, float(cfg_dict["runtime"]["sync_timeout_s"]))
        self.loop = threading.Thread(
            target=serve,
            args=(worker_id, cfg_dict, self.requests, self.outbox, self.weights, self.stopped.is_set),
            daemon=True,
            name=f"rollout-{worker_id}",
        )
        self.loop.start()

    def announce(self, version: int, box: list[Any] | None = None) -> None:
        self.weights.announce(version, box)

    def exchange(self, requests: list[GroupRequest], wait_s: float) -> tuple[str, list[GroupResult]]:
        """Queue `requests`; return (incarnation, finished groups), waiting up to wait_s for the first
        one (so the controller's polling is not a busy loop)."""
        for r in requests:
            self.requests.put(r)
        try:
            first = self.outbox.get(timeout=wait_s)
        except queue.Empty:
            return self.incarnation, []
        return self.incarnation, [first, *self._drain()]

    def _drain(self) -> list[GroupResult]:
        out = []
        while True:
            try:
                out.append(self.outbox.get_nowait())
            except queue.Empty:
                return out

    def stop(self, timeout: float = 30.0) -> list[GroupResult]:
        """Finish the loop; groups it completed meanwhile are returned, unfinished ones stay with the
        controller (carried over)."""
        self.requests.put(STOP)
        self.loop.join(timeout=timeout)
        self.stopped.set()
        return self._drain()

    def weights_status(self) -> str:
        """Where this actor's weight receiver stands (a broadcast rank: joined, not yet, failed)."""
        return self.weights.status()

    def received_weights(self) -> tuple[int, dict[str, Any]]:
        """(version, {name: numpy array}) exactly as this actor's engine would load them (tests, checks)."""
        version, tensors = self.weights.snapshot()
        return version, {k: v.float().numpy() for k, v in tensors.items()}

    def pid(self) -> int:
        import os

        return os.getpid()


ACTOR_STATE_WAIT_S = 10.0  # after a failed join: how much longer an actor not yet started may take
ANSWER_S = 30.0  # an actor that is up answers where its weights stand within this


def actor_states(actors: list[Any], wait_s: float) -> str:
    """Where each rollout actor stands, for an error that waited on all of them: not started within
    `wait_s` more seconds (no free resources yet, or still starting), died (with Ray's reason), or up,
    with where its weight receiver stands."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    refs = [a.__ray_ready__.remote() for a in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
    parts = []
    for i, (actor, ref) in enumerate(zip(actors, refs)):
        if ref not in ready:
            parts.append(f"actor {i} not started {wait_s:g} s later (pending resources? `ray status`)")
            continue
        try:
            ray.get(ref)
            status = ray.get(actor.weights_status.remote(), timeout=ANSWER_S)
        except RayActorError as e:
            parts.append(f"actor {i} died ({_death(e)})")
            continue
        except GetTimeoutError:
            status = f"not answering after {ANSWER_S:g} s"
        except Exception as e:  # this line adds to an error already raised: it must not replace it
            status = f"not telling ({_last_line(e)})"
        parts.append(f"actor {i} up" + (f", {status}" if status else ""))
    return "rollout actors: " + "; ".join(parts)


def _death(e: Any) -> str:
    """Ray's reason for an actor's death on one line: what its __init__ raised (the last line of the
    trace Ray gives), or the system's words without Ray's tab-indented ids."""
    if getattr(e, "actor_init_failed", False):
        return _last_line(e)
    return brief(" ".join(ln for ln in _lines(e) if not ln.startswith("\t")), 200) or type(e).__name__


def _last_line(e: BaseException) -> str:
    """The last line of a remote call's error: what the actor raised, under the trace Ray puts first."""
    lines = _lines(e)
    return brief(lines[-1], 200) if lines else type(e).__name__


def _lines(e: BaseException) -> list[str]:
    """The error's message, its blank lines left out."""
    return [ln for ln in str(e).splitlines() if ln.strip()]
