"""Where rollout workers run, behind one small interface the AsyncRunner drives.

The runner owns admission, staleness, the buffer and the ledger; a backend only moves requests to
workers, results back and weights out. LocalRollouts: local processes, mp queues and SharedWeights.
RayRollouts (placement/ray_rollouts.py): Ray actors, exactly-once re-dispatch when an actor dies, and
object-store or broadcast weight sync.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from streamrl.config import Config, to_dict
from streamrl.placement.cores import ElasticCores, ThreadSetter, elastic_enabled, thread_split
from streamrl.placement.forkserver import apply_environment, worker_context
from streamrl.placement.shared_weights import SharedWeights
from streamrl.placement.worker_log import log_path, start_line, stderr_to, tail
from streamrl.processes import parent_gone
from streamrl.rollout.worker import STOP, GroupRequest, GroupResult


class RolloutBackend(Protocol):
    def start(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Start the workers; they begin on these weights."""

    def wait_ready(self, timeout: float) -> bool:
        """Wait at most `timeout` s for every worker to be ready to generate (imports and model load
        done) or to have ended; returns whether they all are."""

    def submit(self, req: GroupRequest) -> None:
        """Hand one admitted group to some worker (called by the admission thread only)."""

    def resend(self, req: GroupRequest, elsewhere: bool = False) -> None:
        """Send a group in flight again to the worker that holds it, which ignores a copy of a group it
        still generates; to some worker if none holds it. `elsewhere`: to another worker than the one
        that holds it (it has not returned it since the last copy: stuck on it), if there is one.
        Admission thread only (loop/stall.py)."""

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

    def trainer_threads(self) -> ThreadSetter | None:
        """The trainer's side of elastic cores (placement/cores.py), or None when nothing is lent."""


STARTUP_S = 600.0  # a worker that has not started (imports, model load) within this long is silent
STOP_TIMEOUT_S = 30.0  # how long a stop waits for the workers to finish their decode step and exit


class RolloutFailure(RuntimeError):
    """The rollout workers cannot go on (restarts used up): the run stops with its state saved."""


class _Worker:
    """One spawned worker: its own request and result queues (a process killed while holding a shared
    queue's lock would block every other), its heartbeat, its stderr log and the groups it holds.

    The log is the run directory's rollout-worker<i>.log, kept and appended to by every process of that
    worker (restarts, a resumed run), each after a line naming its start; without a run directory, a
    temporary file deleted at close. `log_start`: where the current process's output begins."""

    def __init__(self, ctx: Any, index: int, run_dir: Path | None = None) -> None:
        self.index = index
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        self.heartbeat = ctx.Value("d", 0.0, lock=False)  # 0: not started yet (imports, model load)
        self.kept = run_dir is not None
        if run_dir is not None:
            self.log = log_path(run_dir, index)
            self.log.touch()
        else:
            self.log = Path(tempfile.mkstemp(prefix=f"streamrl-worker{index}-", suffix=".log")[1])
        self.log_start = 0
        self.held: dict[str, GroupRequest] = {}
        self.proc: Any = None
        self.spawned = 0.0

    def begin_log(self) -> None:
        """A line naming the process about to start; its own output follows."""
        with self.log.open("a") as f:
            f.write(start_line(self.index))
            self.log_start = f.tell()

    def close(self) -> None:
        self.requests.cancel_join_thread()
        self.results.cancel_join_thread()
        if not self.kept:
            self.log.unlink(missing_ok=True)


class LocalRollouts:
    """Rollout workers as processes on this machine (forked from a server, placement/forkserver.py);
    weights through shared memory.

    A worker that dies, or whose heartbeat stops for runtime.worker_timeout_s (a hung or stopped
    process: it is killed), is restarted up to runtime.max_restarts times in all, and the groups it held
    go to the new process; each event is one line naming the worker, how it ended and the tail of its
    stderr, counted as `worker_restarts`. When the restarts are used up the run stops (RolloutFailure)."""

    def __init__(self, cfg: Config, worker_target: Callable[..., None]) -> None:
        self.cfg, self.worker_target = cfg, worker_target
        self.ctx = worker_context()  # forked from a server with torch imported (placement/forkserver.py)
        self.workers: list[_Worker] = []
        self.weights: SharedWeights | None = None
        self.restarts = 0
        self.events: list[str] = []
        self._failure: str | None = None
        self._stopping = False  # stop() began: no worker is restarted after it (its STOP went to the old)
        self.cores: ElasticCores | None = None
        if elastic_enabled(cfg):  # slot 0: the trainer (this process), slot 1 + i: worker i
            trainer, rollout = thread_split(cfg)
            self.cores = ElasticCores(
                [trainer] + [rollout] * cfg.runtime.rollout_workers,
                self.ctx,
                policy=cfg.runtime.elastic_cores,
            )
        self._trainer_threads = ThreadSetter(self.cores, 0) if self.cores is not None else None

    def trainer_threads(self) -> ThreadSetter | None:
        return self._trainer_threads

    def _spawn(self, w: _Worker) -> None:
        cfg = self.cfg
        args = (w.index, to_dict(cfg), w.requests, w.results, self.weights, cfg.runtime.rollout_threads)
        w.heartbeat.value = 0.0
        w.begin_log()
        w.spawned = time.monotonic()
        if self.cores is not None:  # a restarted worker's dead predecessor holds nothing
            self.cores.reset(1 + w.index)
        w.proc = self.ctx.Process(
            target=_worker_main,
            args=(self.worker_target, str(w.log), w.heartbeat, self.cores, dict(os.environ), *args),
            daemon=True,
        )
        w.proc.start()
        # the parent never puts results: without its copy of the pipe's write end, a worker killed
        # mid-send leaves EOF where the parent's read would otherwise wait for the rest forever
        w.results._writer.close()  # type: ignore[attr-defined]

    def start(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.weights = SharedWeights(state, self.ctx)
        self.weights.publish(state, version)
        run_dir = Path(self.cfg.run_dir) if self.cfg.run_dir and Path(self.cfg.run_dir).is_dir() else None
        self.workers = [_Worker(self.ctx, i, run_dir) for i in range(self.cfg.runtime.rollout_workers)]
        for w in self.workers:
            self._spawn(w)

    def wait_ready(self, timeout: float) -> bool:
        """A worker is ready once it polls its requests (its heartbeat's first beat)."""
        deadline = time.monotonic() + timeout
        while not (ready := all(w.heartbeat.value > 0 or not w.proc.is_alive() for w in self.workers)):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        return ready

    def submit(self, req: GroupRequest) -> None:
        w = min(self.workers, key=lambda w: len(w.held))
        w.held[req.group_id] = req
        w.requests.put(req)

    def resend(self, req: GroupRequest, elsewhere: bool = False) -> None:
        holder = next((w for w in self.workers if req.group_id in w.held), None)
        others = [w for w in self.workers if w is not holder]
        if holder is None or (elsewhere and others):
            w = min(others, key=lambda w: len(w.held))
            w.held[req.group_id] = req
            w.requests.put(req)
        else:
            holder.requests.put(req)

    def poll(self, timeout: float) -> list[GroupResult]:
        """Finished groups from any worker: waits (blocking, no spinning) up to about `timeout` s."""
        out = self._supervise()
        out += self._drain()
        if out:
            return out
        per = timeout / max(1, len(self.workers))
        for w in self.workers:
            try:
                res = w.results.get(timeout=per)
            except (queue.Empty, OSError, EOFError):  # a dead worker's broken queue: the supervisor's
                continue
            self._returned(res)
            return [res, *self._drain()]
        return []

    def _drain(self, workers: list[_Worker] | None = None) -> list[GroupResult]:
        out: list[GroupResult] = []
        for w in self.workers if workers is None else workers:
            try:
                while True:
                    res = w.results.get_nowait()
                    self._returned(res)
                    out.append(res)
            except (queue.Empty, OSError, EOFError):  # a dead worker's broken queue: the supervisor's
                pass
        return out

    def _returned(self, res: GroupResult) -> None:
        """No worker needs to generate this group any more (a copy sent elsewhere may be held twice)."""
        for w in self.workers:
            w.held.pop(res.group_id, None)

    def _supervise(self) -> list[GroupResult]:
        """Restart dead or silent workers (the admission thread's call, between polls); -> what a worker
        that exited had sent before it did (an error report, say), read before its queues are replaced."""
        limit = self.cfg.runtime.worker_timeout_s
        out: list[GroupResult] = []
        if self._stopping:  # a worker that exits now obeyed the STOP; a new one would never read it
            return out
        for w in self.workers:
            beat = w.heartbeat.value
            if beat:
                silent, allowed = time.monotonic() - beat, limit
            else:  # not started yet: imports and the model load get a longer allowance
                silent, allowed = time.monotonic() - w.spawned, max(limit, STARTUP_S)
            if w.proc.is_alive() and silent < allowed:
                continue
            if w.proc.is_alive():  # hung or stopped: a SIGKILL ends it whatever it is doing
                how = f"silent for {silent:.0f} s (runtime.worker_timeout_s={allowed:g}): killed"
                w.proc.kill()
                w.proc.join(timeout=10)
            else:
                code = w.proc.exitcode
                how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
                if code is not None and code >= 0:  # it exited: what it sent has left it whole
                    out += self._drain([w])
            said = tail(w.log, w.log_start)
            if self._stopping:  # the stop began meanwhile: the process it ended stays ended
                return out
            if self.restarts >= self.cfg.runtime.max_restarts:
                if self.cores is not None:  # the threads it held or borrowed go back to the others
                    self.cores.reset(1 + w.index)
                self._failure = (
                    f"rollout worker {w.index} {how}; no restarts left (runtime.max_restarts="
                    f"{self.cfg.runtime.max_restarts}); its stderr ended: {said}"
                )
                return out
            self.restarts += 1
            held = list(w.held.values())
            w.requests.cancel_join_thread()
            w.requests = self.ctx.Queue()  # the dead process may have held the old queues' locks
            w.results = self.ctx.Queue()
            self._spawn(w)
            for req in held:
                w.requests.put(req)
            event = (
                f"rollout worker {w.index} {how}; restarted ({self.restarts} of "
                f"{self.cfg.runtime.max_restarts}), its {len(held)} group(s) go to the new process; "
                f"its stderr ended: {said}"
            )
            self.events.append(event)
            print(f"streamrl: {event}", file=sys.stderr, flush=True)
        return out

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        assert self.weights is not None, "start() first"
        self.weights.publish(state, version)

    def failure(self) -> str | None:
        return self._failure

    def stats(self) -> dict[str, int]:
        return {"worker_restarts": self.restarts, **(self.cores.stats() if self.cores is not None else {})}

    def stop(self) -> list[GroupResult]:
        """STOP to every worker; their results are read while they exit (a process does not exit before
        what it put on its result queue has left through the pipe, about 64 KiB: a group of long answers
        sent just before the stop would otherwise hold its worker until it is killed)."""
        self._stopping = True
        for w in self.workers:
            w.requests.put(STOP)
            if w.heartbeat.value == 0.0:  # still loading its model: it has read no request and holds
                w.proc.kill()  # nothing, so a stop (Ctrl-C during start-up) does not wait for the load
        out: list[GroupResult] = []
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(w.proc.is_alive() for w in self.workers) and time.monotonic() < deadline:
            out += self._drain()  # results that arrive while stopping are finished groups: kept
            time.sleep(0.01)
        killed = [w for w in self.workers if w.proc.is_alive()]
        for w in killed:
            said = tail(w.log, w.log_start)
            print(
                f"streamrl: warning: rollout worker {w.index} did not stop within {STOP_TIMEOUT_S:g} s: "
                f"killed (the groups it held are carried over); its stderr ended: {said}",
                file=sys.stderr,
                flush=True,
            )
            w.proc.kill()
        for w in self.workers:
            w.proc.join(timeout=10)
            if w not in killed:  # a killed worker's queue may end in half a result: a read would hang
                out += self._drain([w])
            w.close()
        return out


LEND_AFTER_S = 0.1  # a worker idle this long lends its threads (shorter gaps are admission latency)


class _BeatingRequests:
    """The worker's request queue, beating the heartbeat on every poll. Every worker loop polls its
    requests once per iteration (between decode steps), so the beat stops whenever the loop does: a
    stopped process, a deadlock, or a single step stuck past runtime.worker_timeout_s.

    The polls are also the worker's elastic-cores boundaries: a blocking `get` means it has nothing to
    decode (after LEND_AFTER_S of that it lends its threads), `get_nowait` that a decode step follows
    (it takes its threads, borrowing the trainer's while the trainer waits). A blocking `get` that
    returns work is followed by a decode step too (the prefill of what it returned): it takes its
    threads before it returns, so a worker that lent them never computes on them."""

    def __init__(self, requests: Any, heartbeat: Any, threads: ThreadSetter | None = None) -> None:
        self.requests, self.heartbeat, self.threads = requests, heartbeat, threads
        self._idle_since: float | None = None
        self._orphaned = parent_gone()  # ends a wait for cores if the trainer died

    def _beat(self) -> None:
        self.heartbeat.value = time.monotonic()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        self._beat()
        if self.threads is not None and block:
            now = time.monotonic()
            if self._idle_since is None:
                self._idle_since = now
            elif now - self._idle_since >= LEND_AFTER_S:
                self.threads.wait()
        item = self.requests.get(block, timeout)
        if self.threads is not None and item != STOP:
            self._idle_since = None
            self.threads.work(self._beat, self._orphaned)
        return item

    def get_nowait(self) -> Any:
        self._beat()
        if self.threads is not None:
            self._idle_since = None
            self.threads.work(self._beat, self._orphaned)
        return self.requests.get_nowait()


def _worker_main(
    target: Callable[..., None],
    log: str,
    heartbeat: Any,
    cores: ElasticCores | None,
    env: dict[str, str],
    *args: Any,
) -> None:
    """A started worker: the parent's environment, stderr to its log file (its tail is reported if it
    dies), then the worker itself, whose polls of its request queue are the heartbeat the supervisor
    watches."""
    apply_environment(env)
    stderr_to(os.open(log, os.O_WRONLY | os.O_APPEND))
    index, cfg, requests, *rest = args
    threads = ThreadSetter(cores, 1 + index) if cores is not None else None
    target(index, cfg, _BeatingRequests(requests, heartbeat, threads), *rest)


def make_backend(cfg: Config, worker_target: Callable[..., None]) -> RolloutBackend:
    if cfg.runtime.backend == "ray":
        from streamrl.placement.ray_rollouts import RayRollouts

        return RayRollouts(cfg)
    return LocalRollouts(cfg, worker_target)
