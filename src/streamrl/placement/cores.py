"""Elastic cores: the trainer and the rollout workers lend their threads to each other while they wait.

On shared cores a fixed split idles a core whenever its phase waits: the trainer for rollouts, or a
rollout worker for admissions when generation is ahead. Here every process p owns `base[p]` threads
(the fixed split: slot 0 the trainer, slot 1 + i rollout worker i) and, at its boundaries (the trainer
before each micro-batch and each decoder layer's forward and backward, trainer/boundaries.py; a worker
before each decode step), asks for threads:

    threads(p) = min(total, base[p] + sum(base[q] for every q that waits))

A process about to wait calls `wait(p)`: it lends its base and holds 0 threads. A process about to
compute calls `work(p)`: it takes what it is owed, and when a borrower still holds its base it waits
until the borrower gives it back at its own next boundary (a worker's decode step, a trainer
layer). That is the `lend` policy: both phases run at once whenever both have work. Between steps the
trainer computes without boundaries (the step's record, a save, an evaluation), so there it calls
`own(p)`: it gives back what it borrowed and keeps its base.

The `alternate` policy never runs them at once: the trainer, when it has a batch, takes every core
(the workers yield at their next boundary and wait), and the workers decode on every core while the
trainer waits. It is meant for machines where the two phases slow each other down when they run
together (memory bandwidth), and it keeps the asynchronous pipeline (staleness, partial rollouts,
refilled dynamic sampling); on the 2-core default job it measured mixed (docs/benchmarks.md).

One invariant, kept under one lock (placement/shared_lock.py: the kernel frees it when a process dies
inside it): the threads held at once never exceed the total, so no core is ever oversubscribed; `peak`
records the largest total ever held, and the run's metrics report it. The state is a few shared
integers (multiprocessing shared memory), so spawned workers and the trainer coordinate without
messages. Where the phases have their own devices (a GPU, Ray actors, vLLM's pinned threads, several
trainer ranks) nothing is lent: see `elastic_enabled`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from streamrl.placement.shared_lock import SharedLock

_HELD, _LENDING, _MAX = 0, 1, 2  # per-slot fields
_PEAK, _BORROWS, _RECLAIMS, _TIMEOUTS = 0, 1, 2, 3  # global counters
_THREAD_S, _HELD_S, _SINCE = 0, 1, 2  # per-slot clocks: thread-seconds held, seconds held, last change


class ElasticCores:
    """Thread counts for `len(base)` processes sharing `sum(base)` cores; picklable to spawned workers.

    base: threads each slot owns (slot 0: the trainer, slot 1 + i: rollout worker i).
    ctx: a multiprocessing context (its Arrays back the shared state).
    reclaim_timeout_s: how long `work` waits for a borrower to give threads back before it goes on with
    its base anyway (counted as `timeouts`; a borrower's boundary is normally well under a second).
    clock: monotonic seconds (the thread-seconds each slot held are measured on it)."""

    def __init__(
        self,
        base: list[int],
        ctx: Any,
        reclaim_timeout_s: float = 60.0,
        policy: str = "lend",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not base or min(base) < 1:
            raise ValueError(f"every process needs at least one thread of its own, got {base}")
        if policy not in POLICIES:
            raise ValueError(f"core policy '{policy}': use one of {', '.join(POLICIES)}")
        self.policy = policy
        self.base = list(base)
        self.total = sum(base)
        self.reclaim_timeout_s = reclaim_timeout_s
        self.clock = clock
        self._lock = SharedLock()
        self._slots = ctx.Array("i", 3 * len(base), lock=False)  # held, lending, max held per slot
        self._counts = ctx.Array("l", 4, lock=False)  # peak, borrows, reclaims waited, timeouts
        self._clocks = ctx.Array("d", 3 * len(base), lock=False)  # thread-s, held s, since: per slot
        now = clock()
        for p, b in enumerate(base):  # everyone starts on its own share
            self._slots[3 * p + _HELD] = b
            self._slots[3 * p + _MAX] = b
            self._clocks[3 * p + _SINCE] = now
        self._counts[_PEAK] = self.total

    # ---- the two calls a process makes at its boundaries -----------------------------------------
    def wait(self, p: int) -> None:
        """Slot p is about to wait (no compute until its next `work`): it lends its threads."""
        with self._locked():
            self._set_held(p, 0)
            self._slots[3 * p + _LENDING] = 1

    def work(
        self, p: int, beat: Callable[[], None] | None = None, give_up: Callable[[], bool] | None = None
    ) -> int:
        """Slot p is about to compute: the threads it may use until its next boundary (>= 1).

        Waits (polling every 2 ms, calling `beat` so a supervisor sees the process alive) while a
        borrower still holds p's own threads, or (alternate) while the trainer trains; `give_up()`
        true ends a wait with p's own threads (its parent is gone)."""
        deadline = time.monotonic() + self.reclaim_timeout_s
        waited = False
        while True:
            with self._locked():
                got = self._take(p)
                if got:
                    if waited:
                        self._counts[_RECLAIMS] += 1
                    return got
                yielding = self.policy == "alternate" and p != 0
                # a borrower stuck mid-boundary: go on with our own (a yielding worker waits as long
                # as the trainer trains, unless its parent is gone)
                if (not yielding and time.monotonic() > deadline) or (give_up is not None and give_up()):
                    self._counts[_TIMEOUTS] += 1
                    return self._hold(p, self.base[p])
            waited = True
            if beat is not None:
                beat()
            time.sleep(0.002)

    def own(self, p: int) -> int:
        """Slot p is about to compute outside its boundaries for a while (the trainer between steps: the
        step's record, a save, an evaluation): under `lend` it gives back what it borrowed and keeps its
        own threads, so a lender that wants its threads back does not wait for a boundary seconds away
        (it waits only while a borrower still holds its own, as `work` does); under `alternate` this is
        `work` (the workers yield until it waits)."""
        if self.policy == "lend":
            with self._locked():
                s = self._slots
                s[3 * p + _LENDING] = 0
                others_held = sum(s[3 * q + _HELD] for q in range(len(self.base)) if q != p)
                k = min(self.base[p], self.total - others_held)
                if k >= 1:
                    return self._hold(p, k)
        return self.work(p)

    def reset(self, p: int) -> None:
        """Slot p's process died: it holds nothing (its replacement starts from `work`)."""
        self.wait(p)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The lock. Every process takes it for microseconds at each boundary, so a SIGKILL can land
        inside it: the kernel then frees it with the dead process's file, and the others go on."""
        with self._lock:
            yield

    # ---- under the lock ------------------------------------------------------------------------
    def _take(self, p: int) -> int:
        """Threads for slot p now, or 0 when p must wait for a borrower to give back its own."""
        s = self._slots
        n = len(self.base)
        s[3 * p + _LENDING] = 0
        self._set_held(p, 0)  # at a boundary p runs nothing: recount from zero
        others_held = sum(s[3 * q + _HELD] for q in range(n) if q != p)
        if self.policy == "alternate":
            if p == 0:  # the trainer takes every core once the workers have yielded
                return self._hold(p, self.total) if others_held == 0 else 0
            if not s[_LENDING]:  # the trainer trains, or wants to: the workers yield
                return 0
        lent = sum(self.base[q] for q in range(n) if q != p and s[3 * q + _LENDING])
        want = min(self.total, self.base[p] + lent)
        take = min(want, self.total - others_held)
        if take < min(want, self.base[p]):
            return 0
        return self._hold(p, take)

    def _set_held(self, p: int, k: int) -> None:
        """Slot p now holds k threads; the clocks count what it held since its last change."""
        c, now = self._clocks, self.clock()
        held, dt = self._slots[3 * p + _HELD], now - c[3 * p + _SINCE]
        if held:
            c[3 * p + _THREAD_S] += held * dt
            c[3 * p + _HELD_S] += dt
        c[3 * p + _SINCE] = now
        self._slots[3 * p + _HELD] = k

    def _hold(self, p: int, k: int) -> int:
        s = self._slots
        self._set_held(p, k)
        s[3 * p + _MAX] = max(s[3 * p + _MAX], k)
        held = sum(s[3 * q + _HELD] for q in range(len(self.base)))
        self._counts[_PEAK] = max(self._counts[_PEAK], held)
        if k > self.base[p]:
            self._counts[_BORROWS] += 1
        return k

    # ---- what the run reports --------------------------------------------------------------------
    def held(self) -> list[int]:
        with self._locked():
            return [self._slots[3 * p + _HELD] for p in range(len(self.base))]

    def stats(self) -> dict[str, float]:
        """Cumulative: the most threads ever held at once (never above the cores), boundaries at which
        a process ran on borrowed threads, reclaims that waited for a borrower, reclaim timeouts, the
        most threads the trainer and the workers each held, and the seconds and thread-seconds the
        trainer and the workers (summed) held threads, up to their last boundary: their ratio is the
        mean threads a phase computed on (the simulator's fit, sim/fit.py, reads it)."""
        with self._locked():
            maxes = [self._slots[3 * p + _MAX] for p in range(len(self.base))]
            c, workers = self._clocks, range(1, len(self.base))
            return {
                "cores_total": self.total,
                "cores_peak_held": int(self._counts[_PEAK]),
                "cores_borrows": int(self._counts[_BORROWS]),
                "cores_reclaims_waited": int(self._counts[_RECLAIMS]),
                "cores_reclaim_timeouts": int(self._counts[_TIMEOUTS]),
                "cores_trainer_max": maxes[0],
                "cores_worker_max": max(maxes[1:], default=0),
                "cores_trainer_held_s": c[_HELD_S],
                "cores_trainer_thread_s": c[_THREAD_S],
                "cores_worker_held_s": sum(c[3 * p + _HELD_S] for p in workers),
                "cores_worker_thread_s": sum(c[3 * p + _THREAD_S] for p in workers),
            }


POLICIES = ("lend", "alternate")


class ThreadSetter:
    """One process's side: sets torch's intra-op threads to what `work` or `own` grants, only when it
    changes."""

    def __init__(self, cores: ElasticCores, slot: int) -> None:
        self.cores, self.slot = cores, slot
        self.current = 0

    def work(self, beat: Callable[[], None] | None = None, give_up: Callable[[], bool] | None = None) -> int:
        return self._use(self.cores.work(self.slot, beat, give_up))

    def own(self) -> int:
        return self._use(self.cores.own(self.slot))

    def wait(self) -> None:
        self.cores.wait(self.slot)

    def _use(self, k: int) -> int:
        if k != self.current:
            import torch

            torch.set_num_threads(k)
            self.current = k
        return k


def elastic_enabled(cfg: Any) -> bool:
    """Lending needs processes that share this machine's cores: async on the local backend, the
    default engine on the CPU, one trainer rank. Anywhere else each phase keeps its own device."""
    return bool(
        cfg.runtime.elastic_cores != "fixed"
        and cfg.runtime.mode == "async"
        and cfg.runtime.backend == "local"
        and cfg.engine == "hf"
        and str(cfg.device).startswith("cpu")
        and cfg.train.world_size == 1
    )


def thread_split(cfg: Any) -> tuple[int, int]:
    """(trainer threads, rollout threads per worker): async splits the cores, colocated takes all. These
    are the base shares elastic cores lend and reclaim."""
    cores = os.cpu_count() or 1
    if cfg.runtime.mode == "colocated":
        return cfg.train.threads or cores, 0
    rollout = cfg.runtime.rollout_workers * cfg.runtime.rollout_threads
    return cfg.train.threads or max(1, cores - rollout), cfg.runtime.rollout_threads
