"""RewardService: score responses in a worker pool, concurrently with generation, never failing the run.

A scorer is any callable ``scorer(*args) -> reward`` or ``-> (reward, info: dict)``. Each call costs
at most one reward: a call that raises, returns a non-finite reward, runs past ``timeout_s`` or kills
its worker process (``os._exit``, segfault, OOM kill) resolves to reward 0.0 with ``error`` set to a
short reason ("timeout", "ValueError", "WorkerDied", ...), which is counted in ``metrics()`` and
logged (the first of each kind at WARNING, later ones at DEBUG). The caller never sees an exception.

Modes:
- "process" (default): our own pool of spawn-context worker processes, one duplex pipe each. A monitor
  thread hands one task at a time to each idle worker and waits on the pipes, the process sentinels
  and the nearest deadline. A worker that misses its deadline is SIGKILLed and replaced; a worker
  that dies is replaced. concurrent.futures.ProcessPoolExecutor is not used because it cannot kill a
  single hung task and declares the whole pool broken when one worker dies.
  The scorer must be picklable (a top-level function or an instance of a top-level class). The
  worker loop lives in rewards/workers.py, which imports only the stdlib, so workers start fast.
- "thread": the same monitor over threads, for I/O-bound scorers (an HTTP judge) and unpicklable
  ones. A timed-out thread cannot be killed: it is abandoned (its late result is dropped) and a fresh
  thread takes its place; a scorer that asks workers.time_left() between its steps (the code task,
  between tests) stops there. A crash of the interpreter (os._exit, segfault) is not isolated.
- "inline": the scorer runs in the caller's thread on submit. No timeout, no isolation: for debugging.

Results are cached by (scorer name, args) in an LRU of ``cache_size`` entries (0 disables); only
successes are cached. Identical requests in flight at the same time share one call (and its outcome,
failure included). Args that are not hashable are not cached unless ``submit(..., cache_key=...)``
gives a key. In both pool modes args and results travel pickled through a pipe. Call ``close()`` or
use the service as a context manager.

Using it from your own code: docs/rewards.md (the reward service).
"""

from __future__ import annotations

import itertools
import logging
import math
import multiprocessing as mp
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from streamrl.rewards.service_stats import ServiceStats
from streamrl.rewards.workers import Task, Worker, call_scorer, check_picklable

log = logging.getLogger(__name__)

MODES = ("process", "thread", "inline")


@dataclass
class RewardOutcome:
    """The result of one scoring request. error is None on success, else a short reason; info then
    carries ``error_detail``. latency_s runs from submit to result (queueing included)."""

    reward: float
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    latency_s: float = 0.0
    cached: bool = False


class RewardService:
    """Concurrent, isolated, cached scoring. Thread-safe: submit from any thread.

    scorer_fn(*args) -> float | (float, dict). timeout_s bounds one call from the moment a worker takes
    it (queue time excluded). start_timeout_s bounds a worker's start-up; three start-up failures in a
    row (e.g. the scorer cannot be unpickled in a fresh process) fail every request with
    "WorkerStartFailed" instead of respawning forever. first_failure_level: how the first failure of
    each kind is logged (later ones at DEBUG); DEBUG where something else shows it to the user.
    """

    def __init__(
        self,
        scorer_fn: Callable[..., Any],
        workers: int = 2,
        timeout_s: float = 10.0,
        cache_size: int = 10_000,
        mode: str = "process",
        start_timeout_s: float = 60.0,
        name: str | None = None,
        first_failure_level: int = logging.WARNING,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"RewardService mode '{mode}' is unknown; choose from {', '.join(MODES)}")
        if workers < 1 or timeout_s <= 0 or cache_size < 0:
            raise ValueError(
                f"RewardService needs workers >= 1, timeout_s > 0, cache_size >= 0 "
                f"(got workers={workers}, timeout_s={timeout_s}, cache_size={cache_size})"
            )
        if mode == "process":
            check_picklable(scorer_fn)
        self.first_failure_level = first_failure_level
        self.scorer_fn, self.workers, self.timeout_s, self.mode = scorer_fn, workers, timeout_s, mode
        self.cache_size, self.start_timeout_s = cache_size, start_timeout_s
        self.name = (
            name
            or getattr(scorer_fn, "name", None)
            or getattr(scorer_fn, "__qualname__", type(scorer_fn).__name__)
        )
        self._lock = threading.Condition()
        self._cache: OrderedDict[Hashable, tuple[float, dict[str, Any]]] = OrderedDict()
        self._inflight: dict[Hashable, list[tuple[Future, float]]] = {}  # key -> followers
        self._pending: deque[Task] = deque()
        self._ids = itertools.count()
        self._closed = self._cancel = False
        self._broken: str | None = None  # why every request now fails, with the reason _broken_as
        self._broken_as, self._n_ready = "WorkerStartFailed", 0
        self._pool: list[Worker] = []
        self._stats = ServiceStats()
        if mode == "inline":
            return
        self._ctx = mp.get_context("spawn")  # fork would copy the trainer's threads and torch state
        self._wake_r, self._wake_w = mp.Pipe(duplex=False)
        self._woken = False
        self._monitor = threading.Thread(target=self._run, name="reward-service", daemon=True)
        self._monitor.start()

    # ------------------------------------------------------------------------------------ public API

    def submit(self, *args: Any, cache_key: Hashable | None = None) -> Future:
        """Queue scorer_fn(*args). -> Future[RewardOutcome]; its result() never raises."""
        t0 = time.monotonic()
        fut: Future = Future()
        key = self._key(args, cache_key)
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardService is closed: submit before close(), or create a new service")
            if key is not None and key in self._cache:
                self._cache.move_to_end(key)
                reward, info = self._cache[key]
                self._finish(fut, RewardOutcome(reward, dict(info), None, time.monotonic() - t0, True))
                return fut
            if key is not None and key in self._inflight:  # the same request is being scored: share it
                self._inflight[key].append((fut, t0))
                return fut
            if self._broken:
                self._finish(fut, self._failed(self._broken_as, self._broken, t0))
                return fut
            if key is not None:
                self._inflight[key] = []
            task = Task(next(self._ids), args, key, fut, t0)
            if self.mode != "inline":
                self._pending.append(task)
                self._wake()
                return fut
        status, a, b, kept = call_scorer(self.scorer_fn, args)
        outcome = RewardOutcome(a, b) if status == "ok" else self._failed(a, b, t0, kept)
        outcome.latency_s = time.monotonic() - t0
        with self._lock:
            self._complete(task, outcome)
        return fut

    def score_many(self, items: Sequence[tuple]) -> list[RewardOutcome]:
        """Score every args tuple concurrently; outcomes in input order. Never raises for scorer faults."""
        futures = [self.submit(*args) for args in items]
        return [f.result() for f in futures]

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Block until every worker has started (True) or timeout_s passes (False)."""
        if self.mode == "inline":
            return True
        with self._lock:
            self._lock.wait_for(lambda: self._n_ready >= self.workers or self._broken is not None, timeout_s)
            return self._n_ready >= self.workers

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """Flat snapshot for a per-step record. count covers every outcome (cached and failed ones too);
        timeouts are counted apart from errors (errors/<reason> per reason); latencies cover scored,
        non-cached requests. reset=True zeroes counters and latencies after reading (per-step deltas)."""
        with self._lock:
            m = self._stats.snapshot(len(self._cache), len(self._pending))
            if reset:
                self._stats.reset()
        return m

    def close(self, wait: bool = True) -> None:
        """Stop the workers. wait=True lets queued and running requests finish (each bounded by
        timeout_s); wait=False resolves them at once with error "ServiceClosed". Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed, self._cancel = True, not wait
            if self.mode != "inline":
                self._wake()
        if self.mode != "inline":
            self._monitor.join()
            for w in self._pool:  # stopped by the monitor already, unless it died: they ignore SIGTERM
                w.kill()

    def __enter__(self) -> RewardService:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(wait=exc_type is None)

    # ------------------------------------------------------------------------- bookkeeping (locked)

    def _key(self, args: tuple, cache_key: Hashable | None) -> Hashable | None:
        if self.cache_size == 0:
            return None
        key = (self.name, cache_key if cache_key is not None else args)
        try:
            hash(key)
        except TypeError:  # unhashable args and no explicit key: score without caching
            return None
        return key

    def _failed(
        self, reason: str, detail: str, t0: float, kept: dict[str, Any] | None = None
    ) -> RewardOutcome:
        """Reward 0 for `reason`; `kept`: what the scorer still knew (a ScoreFailed's info)."""
        return RewardOutcome(0.0, {**(kept or {}), "error_detail": detail}, reason, time.monotonic() - t0)

    def _finish(self, fut: Future, outcome: RewardOutcome) -> None:
        """Count one outcome and resolve its future. Caller holds the lock."""
        first = self._stats.record(outcome.cached, outcome.latency_s, outcome.error)
        if outcome.error is not None:  # named after your reward function when one of them failed
            level = self.first_failure_level if first else logging.DEBUG
            fn = outcome.info.get("reward_fn")
            who = f"function {fn}" if fn else self.name
            log.log(level, "reward %s -> 0.0 (%s: %s)", who, outcome.error, outcome.info.get("error_detail"))
        if fut.running() or fut.set_running_or_notify_cancel():  # a future cancelled while queued stays so
            fut.set_result(outcome)

    def _complete(self, task: Task, outcome: RewardOutcome) -> None:
        """Resolve a scored task, its in-flight followers and the cache. Caller holds the lock."""
        self._finish(task.future, outcome)
        followers = self._inflight.pop(task.key, []) if task.key is not None else []
        if outcome.error is None and task.key is not None:
            self._cache[task.key] = (outcome.reward, outcome.info)
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        now = time.monotonic()
        for fut, t0 in followers:
            ok = outcome.error is None
            self._finish(fut, RewardOutcome(outcome.reward, dict(outcome.info), outcome.error, now - t0, ok))

    def _wake(self) -> None:
        if not self._woken:  # at most one byte in the pipe: submit never blocks on a slow monitor
            self._woken = True
            self._wake_w.send_bytes(b"!")

    # ---------------------------------------------------------------------------- monitor thread

    def _spawn(self, i: int) -> Worker:
        return Worker(self._ctx, self.scorer_fn, self.mode, f"reward-worker-{i}")

    def _run(self) -> None:
        """The monitor thread: _serve until closed. A fault of the monitor itself fails every request,
        queued, running and later, with "ServiceFailed" instead of leaving them to the caller's wait."""
        try:
            self._serve()
        except Exception as e:
            log.exception("RewardService %s: the monitor thread failed", self.name)
            with self._lock:  # the running tasks fail with the queued ones
                self._pending.extendleft(w.task for w in self._pool if w.task is not None)
                self._break(f"the monitor thread failed ({type(e).__name__}: {e})", "ServiceFailed")
            for w in self._pool:
                w.kill()

    def _serve(self) -> None:
        """Hand out tasks, collect results, enforce deadlines, replace failed workers; until closed."""
        self._pool = pool = [self._spawn(i) for i in range(self.workers)]
        start_failures = 0  # workers in a row that died before saying ready
        while True:
            with self._lock:
                busy = any(w.task for w in pool)
                if self._closed and (self._cancel or (not self._pending and not busy)):
                    break
                idle = [w for w in pool if w.ready and w.task is None]
                handed = [(w, self._pending.popleft()) for w in idle if self._pending]
            for w, task in handed:
                self._hand(w, task)
            now = time.monotonic()
            soonest = min([w.deadline for w in pool] + [now + 1.0])  # 1 s: start-up deadlines too
            ready = set(
                wait([self._wake_r] + [x for w in pool for x in w.waitables()], max(0.0, soonest - now))
            )
            if self._wake_r in ready:
                with self._lock:
                    while self._wake_r.poll():
                        self._wake_r.recv_bytes()
                    self._woken = False
            survivors = []
            for i, w in enumerate(pool):
                reason = self._check(w, ready)
                if reason is None:
                    survivors.append(w)
                    continue
                start_failures = 0 if w.ready else start_failures + 1
                w.kill()
                with self._lock:
                    self._n_ready -= w.ready
                    if w.task is not None:
                        self._complete(w.task, self._failed(*reason, w.task.submitted, w.kept))
                        w.task = None
                    self._stats.restarts += 1
                    if start_failures >= 3:
                        self._break(f"3 workers in a row died before becoming ready (last: {reason[1]})")
                if self._broken is None:  # once broken, respawning a scorer that cannot start would spin
                    log.warning("reward worker %d replaced: %s", i, reason[1])
                    survivors.append(self._spawn(i))
            self._pool = pool = survivors
        with self._lock:
            for task in list(self._pending) + [w.task for w in pool if w.task is not None]:
                self._complete(task, self._failed("ServiceClosed", "closed before scoring", task.submitted))
            self._pending.clear()
        for w in pool:
            w.stop()

    def _hand(self, w: Worker, task: Task) -> None:
        """Send one task to an idle worker and start its deadline."""
        # cancelled while queued (a task requeued after a failed send is running already)
        if not (task.future.running() or task.future.set_running_or_notify_cancel()):
            with self._lock:
                followers = self._inflight.get(task.key) if task.key is not None else None
                if followers:  # others wait for the same score: the first of them takes the call over
                    fut, t0 = followers.pop(0)
                    self._pending.appendleft(Task(task.tid, task.args, task.key, fut, t0))
                else:
                    self._inflight.pop(task.key, None)
                self._wake()  # the worker is still idle: hand it the next task now, not after a wait
            return
        w.task, w.kept, w.deadline = task, {}, time.monotonic() + self.timeout_s
        try:
            w.conn.send((task.tid, task.args, self.timeout_s))
        except Exception as e:  # pickling runs the args' own code: whatever it raises costs that task
            w.task, w.deadline = None, math.inf
            with self._lock:
                if isinstance(e, OSError):  # the worker just died: requeue; its sentinel says why
                    self._pending.appendleft(task)
                else:
                    self._complete(task, self._failed("UnpicklableArgs", str(e), task.submitted))

    def _check(self, w: Worker, ready: set[Any]) -> tuple[str, str] | None:
        """Collect a worker's results. -> (reason, detail) if it must be replaced, else None."""
        reason = self._drain(w) if w.conn in ready else None
        if reason is None and w.proc is not None and w.proc.sentinel in ready:
            self._drain(w)  # a result written just before exit still counts
            w.proc.join(1)  # the sentinel can fire a moment before the exit status is ready
            return ("WorkerDied", f"worker process exited with code {w.proc.exitcode}")
        now = time.monotonic()
        if reason is None and w.task is not None and now >= w.deadline:
            reason = self._drain(w)  # a result sent after `ready` was taken (the monitor descheduled) counts
            if reason is None and w.task is not None:
                return ("timeout", f"no result within {self.timeout_s:g}s; worker replaced")
        if reason is None and not w.ready and now - w.started > self.start_timeout_s:
            return ("WorkerStartFailed", f"worker not ready after {self.start_timeout_s:g}s")
        return reason

    def _drain(self, w: Worker) -> tuple[str, str] | None:
        """Read every message a worker has sent. -> a failure reason if its pipe broke."""
        try:
            while w.conn.poll():
                msg = w.conn.recv()
                if msg == ("ready",):
                    w.ready = True
                    with self._lock:
                        self._n_ready += 1
                        self._lock.notify_all()
                    continue
                if msg[0] == "kept":  # ("kept", task id, info): mid-score, for a failure to come
                    if w.task is not None and w.task.tid == msg[1]:
                        w.kept = msg[2]
                    continue
                tid, status, a, b, kept = msg
                task = w.task
                if task is None or task.tid != tid:
                    continue
                w.task, w.deadline = None, math.inf
                with self._lock:
                    lat = time.monotonic() - task.submitted
                    scored = RewardOutcome(a, b, latency_s=lat) if status == "ok" else None
                    self._complete(task, scored or self._failed(a, b, task.submitted, kept))
        except (EOFError, OSError):
            code = None
            if w.proc is not None:
                w.proc.join(1)  # the pipe closes as the process exits: give the exit code a moment
                code = w.proc.exitcode
            return ("WorkerDied", f"worker pipe closed (exit code {code})")
        return None

    def _break(self, reason: str, label: str = "WorkerStartFailed") -> None:
        """Give up (on starting workers, by default): fail queued requests now and new ones on submit,
        with error `label`. Locked."""
        if self._broken is None:
            log.error("RewardService %s: %s; every request now scores 0", self.name, reason)
        self._broken, self._broken_as = reason, label
        while self._pending:
            task = self._pending.popleft()
            self._complete(task, self._failed(label, reason, task.submitted))
        self._lock.notify_all()
