"""The asynchronous RL loop: rollout workers generate while the trainer trains.

Main process: an admission thread (loop/admission.py) feeds rollout workers under the staleness
bound and collects their finished groups into a buffer; the main thread takes a batch of B groups as
soon as one is ready, trains, publishes the weights to shared memory and only then raises the
version, so that eta = 0 is exactly synchronous. A batch takes first, and waits for, the groups on
their last version within the bound (`_pick`), so with eta <= 1 no group comes back staler than eta;
with a larger eta one that does is filtered and counted, never trained. Unfinished requests keep
generating across steps (partial rollouts) and are carried into the checkpoint on stop.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from streamrl.config import Config
from streamrl.data.replay import ReplayBuffer
from streamrl.loop.admission import Admission
from streamrl.loop.budget import RunBudget
from streamrl.loop.dynamic_sampling import DynamicSampling, applies
from streamrl.loop.episode_errors import EpisodeErrors
from streamrl.loop.ledger import Ledger
from streamrl.loop.shared import LoopParts, RunCounters, Shared
from streamrl.loop.signals import StopFlag
from streamrl.loop.staleness import StalenessManager, next_in_batch
from streamrl.loop.stall import StallWatch
from streamrl.loop.state import RunState, sampler_state
from streamrl.loop.step import StepRecord, train_on
from streamrl.placement.backend import STARTUP_S, RolloutBackend, RolloutFailure, make_backend
from streamrl.rollout.drafts import DraftStore, draft_store
from streamrl.rollout.trajectory import RolloutSettings
from streamrl.rollout.worker import GroupResult, run_worker
from streamrl.trainer.trainer import Trainer
from streamrl.types import Group, Problem


class AsyncRunner:
    def __init__(
        self,
        cfg: Config,
        trainer: Trainer,
        tokenizer: Any,
        stream: Iterator[Problem],
        state: RunState,
        stop: StopFlag,
        worker_target: Callable[..., None] = run_worker,
        on_group_scored: Callable[[Group], None] | None = None,
        replay: ReplayBuffer | None = None,
        backend: RolloutBackend | None = None,
    ) -> None:
        self.cfg, self.trainer, self.tokenizer = cfg, trainer, tokenizer
        self.replay = replay  # rollout replay
        self.worker_target = worker_target  # tests swap in a scripted engine (local backend)
        self.stop = stop
        self.B, self.eta = cfg.rollout.prompts_per_step, cfg.max_staleness
        r = cfg.rollout
        settings = RolloutSettings.from_config(cfg)
        ledger = Ledger()
        if state.ledger:
            ledger.load_state_dict(state.ledger)
        sh = Shared.resumed(state.engine)  # the workers' cumulative counters continue after a resume
        for res in state.finished:
            ledger.requeue(res.group_id, "buffered")
            sh.buffer.append(res)
        # what the admission thread (which admits requests and takes their results in) shares with the
        # trainer's side: held here only, the properties below read it
        self.parts = LoopParts(
            sh=sh,
            state=state,
            stream=stream,
            backend=backend or make_backend(cfg, worker_target),  # runtime.backend: local | ray
            ledger=ledger,
            # rebase on resume: trained groups + carried finished ones count as accepted (AReaL #1388)
            staleness=StalenessManager.resumed(self.B, self.eta, trainer.version, len(state.finished), 0),
            stall=StallWatch(cfg.runtime.worker_timeout_s),  # groups that never come back (sh.cond)
            sampling=DynamicSampling(applies(cfg), self.B, r.dynamic_sampling_rounds),
            # agent episodes since the last step (sh.cond), those a stopped run had not logged included
            episode_errors=EpisodeErrors(cfg.task.startswith("agent:"), state.episodes),
            # speculative rollouts: every returned group's responses are drafts for its prompt's next group
            drafts=draft_store(r.spec_drafts, r.spec_prompts, state.drafts),
        )
        self.counters = RunCounters(state.counters)  # the run's event counters continue after a resume too
        # group id -> its oldest token's version, found once: a returned group's tokens never change (sh.cond)
        self.oldest: dict[str, int] = {}
        self._started = self._closed = False  # the workers (start, close)
        self.in_step = False  # between taking a batch and counting its step: nothing to save
        self.admission = Admission(
            self.parts,
            tokenizer=tokenizer,
            settings=settings,
            on_group_scored=on_group_scored,  # the sampler's feedback
            published=trainer.version,  # the weights backend.start gives the workers
        )
        # elastic cores: the trainer lends its threads while it waits for rollouts (placement/cores.py)
        self.threads = self.backend.trainer_threads()

    @property
    def sh(self) -> Shared:
        return self.parts.sh

    @property
    def state(self) -> RunState:
        return self.parts.state

    @property
    def stream(self) -> Iterator[Problem]:
        return self.parts.stream

    @property
    def backend(self) -> RolloutBackend:
        return self.parts.backend

    @property
    def ledger(self) -> Ledger:
        return self.parts.ledger

    @property
    def staleness(self) -> StalenessManager:
        return self.parts.staleness

    @property
    def stall(self) -> StallWatch:
        return self.parts.stall

    @property
    def sampling(self) -> DynamicSampling:
        return self.parts.sampling

    @property
    def episode_errors(self) -> EpisodeErrors:
        return self.parts.episode_errors

    @property
    def drafts(self) -> DraftStore | None:
        return self.parts.drafts

    def _take_batch(self) -> list[GroupResult] | None:
        """B groups within the staleness bound, oldest first; None if a stop was requested."""
        taken: list[GroupResult] = []
        lent = False  # the trainer's threads, lent once per wait (its next `work` takes them back)
        with self.sh.cond:
            try:
                while len(taken) < self.B:
                    if self.sh.errors:
                        raise RuntimeError(self.sh.errors.pop(0))
                    if self.stop:
                        break
                    res = self._pick(self.B - len(taken))
                    if res is None:
                        failure = self.backend.failure()
                        if failure:
                            raise RolloutFailure(failure)
                        if self.threads is not None and not lent:  # outside our lock: lending may wait
                            self.sh.cond.release()  # on the cores' lock, and a worker stopped inside it
                            try:  # must stay restartable by the admission thread
                                self.threads.wait()
                            finally:
                                self.sh.cond.acquire()
                            lent = True  # then look again: a group may have come meanwhile
                            continue
                        self.stall.waiting(True)
                        self.sh.cond.wait(timeout=0.5)
                        continue
                    if self.trainer.version - self._oldest(res) > self.eta:
                        self.oldest.pop(res.group_id, None)
                        self.ledger.filtered(res.group_id, "stale")
                        self.staleness.release_accepted()
                        continue
                    taken.append(res)
            except BaseException:
                self.sh.buffer.extendleft(reversed(taken))  # a failure carries them over too
                raise
            finally:
                self.stall.waiting(False)
            if len(taken) < self.B:  # a stop: put back, nothing is lost
                self.sh.buffer.extendleft(reversed(taken))
                return None
        return taken

    def _pick(self, room: int) -> GroupResult | None:
        """The next buffered group for a batch with `room` places left, or None to wait (under sh.cond):
        groups on their last version within the bound first, waited for (loop/staleness.py)."""
        v, buffer = self.trainer.version, self.sh.buffer
        running = (req.admitted_version for req in self.sh.inflight.values())
        i = next_in_batch([self._oldest(r) for r in buffer], running, v, self.eta, room)
        if i is None:
            return None
        res = buffer[i]
        del buffer[i]
        return res

    def _oldest(self, res: GroupResult) -> int:
        """The policy version of a returned group's oldest token (the trainer's if it has none)."""
        if res.group_id not in self.oldest:
            assert res.group is not None
            versions = [min(t.versions) for t in res.group.trajectories if t.versions]
            if not versions:
                return self.trainer.version
            self.oldest[res.group_id] = min(versions)
        return self.oldest[res.group_id]

    def run(
        self, on_step: Callable[[StepRecord], None], on_stop: Callable[[RunState], None] | None = None
    ) -> None:
        """Train until the budget ends; `on_step` gets each step's record. A stop hands the run's state
        to `on_stop` (the job saves it) as soon as the loop ends, before the workers are stopped (which
        may take STOP_TIMEOUT_S and more); `close` then carries over what came back meanwhile too."""
        cfg = self.cfg
        if self.stop or self.state.step >= cfg.max_steps:  # stopped during the base evaluation, or done
            try:
                self._stopped(on_stop)
            finally:
                self.close()
            return
        backend = self.backend
        self.start()
        self.wait_ready()
        self.admission.start()
        # from here the admission thread draws: whatever raises, the finally stops it and carries
        # over what it drew before the state is saved
        try:
            if self.threads is not None:
                self.trainer.set_boundary(self.threads.work)
            budget = RunBudget(cfg.max_steps, cfg.max_time, self.stop)
            waited, first_step = 0.0, self.state.step  # a resumed run's rates count its own steps
            # but its share of time waiting is over the whole run, as engine_idle_share is (0: a state
            # saved before these totals were)
            saved = self.state.clock
            waited_before, elapsed_before = saved.get("trainer_waited", 0.0), saved.get("loop_elapsed", 0.0)
            per_step = self.B * cfg.rollout.samples_per_prompt
            while budget.more(self.state.step):
                t0 = time.perf_counter()
                taken = self._take_batch()
                if taken is None:
                    break
                self.in_step = True  # the weights may change before the step counts
                if self.threads is not None:  # back from lending: take our threads (and any lent to us)
                    self.threads.work()
                wait = time.perf_counter() - t0
                waited += wait
                with self.sh.cond:
                    in_flight = len(self.sh.inflight)
                step = self.state.step + 1
                groups = [r.group for r in taken if r.group is not None]
                publish = functools.partial(self._publish, step)
                try:
                    rec = train_on(step, groups, self.trainer, cfg, publish, self.replay)
                except BaseException:
                    with self.sh.cond:
                        self.sh.buffer.extendleft(reversed(taken))  # not trained: carried over
                    raise
                if self.threads is not None:  # what it borrowed goes back: a worker that wants its own
                    self.threads.own()  # must not wait through on_step (a save, an evaluation)
                with self.sh.cond:
                    self.sampling.next_step()
                    for r in taken:
                        self.ledger.trained(r.group_id)
                        self.oldest.pop(r.group_id, None)
                    self.ledger.replayed(int(rec.metrics.get("replay_samples", 0)))
                    busy, idle, generated = self.sh.busy, self.sh.idle, self.sh.generated
                    row_share = self.sh.cache_rows / self.sh.rows if self.sh.rows else 1.0
                    episode_errors = self.episode_errors.take()
                self.state.step = step
                self.state.version = self.trainer.version
                self.in_step = False
                rec.last = not budget.more(step)  # saved by the final save then, not a periodic one
                try:  # the step is trained and counted: it is logged even if a statistic fails
                    elapsed = budget.elapsed
                    rec.clock = {
                        "trainer_waited": waited_before + waited,
                        "loop_elapsed": elapsed_before + elapsed,
                    }
                    m = rec.metrics
                    m.update(
                        tokens_per_s=(m["tokens_generated"] + m["tokens_trained"])
                        / (wait + m["train_time"] + m["weight_sync_time"]),
                        trainer_wait_time=wait,
                        trainer_wait_share=rec.clock["trainer_waited"] / rec.clock["loop_elapsed"],
                        engine_idle_share=idle / max(busy + idle, 1e-9),
                        engine_busy_time=busy,  # cumulative seconds the rollout workers spent generating
                        engine_tokens=generated,  # cumulative tokens they sampled, dropped groups' too
                        engine_row_share=row_share,  # KV-cache rows per sequence in their decode steps
                        groups_carried_over=in_flight,
                        samples_per_s=(step - first_step) * per_step / elapsed,
                        filtered_stale=self.ledger.filter_reasons.get("stale", 0),
                        filtered_zero_variance=self.ledger.filter_reasons.get("zero_variance", 0),
                        **self.counters.step(backend.stats(), self.sh.duplicates, self.stall.resent),
                        **episode_errors,
                    )
                finally:
                    on_step(rec)
            self._stopped(on_stop)
        finally:
            self.trainer.set_boundary(None)
            if self.threads is not None:  # the trainer computes no more: a worker yielding to it (alternate)
                self.threads.wait()  # would otherwise never reach the stop request at its next decode step
            self.admission.stop(timeout=10)
            self.close()

    def _stopped(self, on_stop: Callable[[RunState], None] | None) -> None:
        """If a stop ended the loop: its state, what is buffered or in flight carried over, to `on_stop`."""
        if self.stop and on_stop is not None:
            on_stop(self.snapshot(stats_now=True))

    def start(self) -> None:
        """Start the rollout workers on the trainer's weights (once; the job calls it before the base
        evaluation, so their imports and model load overlap it)."""
        if self._started:
            return
        self._started = True
        try:
            self.backend.start(self.trainer.policy_state(), self.trainer.version)
        except BaseException:
            self.close()  # nothing started generating: all admitted work carries over
            raise

    def wait_ready(self) -> float:
        """Wait until the workers can generate (the loop's clock starts after it), a stop is requested or
        STARTUP_S passed; -> seconds waited."""
        t0 = time.monotonic()
        while self._started and not self.stop and time.monotonic() - t0 < STARTUP_S:
            if self.backend.wait_ready(0.2):
                break
        return time.monotonic() - t0

    def close(self) -> None:
        """Stop the workers (if started) and carry over what was admitted and not trained; once (the loop
        closes, and so does the job, however it ends)."""
        if not self._closed:
            self._closed = True
            late: list[GroupResult] = []
            try:
                late = self.backend.stop() if self._started else []
            finally:  # a stop that fails still leaves the state's carry-over exact
                self._carry_over(late)

    def _publish(self, step: int) -> None:
        """New weights to every worker; only then may admissions see the new version (eta = 0 is
        exactly synchronous). No admissions for a step that will not come."""
        self.backend.publish(self.trainer.policy_state(), self.trainer.version)
        self.admission.published = self.trainer.version
        if step < self.cfg.max_steps:
            self.staleness.set_version(self.trainer.version)

    def stream_position(self) -> dict[str, Any]:
        """Where the training stream stands (the admission thread draws no more once carried over)."""
        return sampler_state(self.stream)

    def snapshot(self, stats_now: bool = False) -> RunState:
        """The run's position between two steps (called by the trainer thread, e.g. for a periodic
        save): what is buffered or in flight counts as carried over, as a stop would make it.
        stats_now: the backend's counters as they are now (a stop's save, which the carry-over's save
        replaces only if something changed), not as of the last step."""
        if stats_now:
            self.counters.refresh(self.backend)  # outside sh.cond: it may wait on the cores' lock
        with self.sh.cond:
            return dataclasses.replace(
                self.state,
                ledger=self.ledger.snapshot(),
                staleness=self.staleness.state_dict(),
                finished=list(self.sh.buffer),
                unfinished=list(self.admission.readmit) + list(self.sh.inflight.values()),
                sampler=sampler_state(self.stream),
                drafts=self.drafts.state_dict() if self.drafts is not None else self.state.drafts,
                engine=self.sh.engine_counters(),
                counters=self.counters.total(self.sh.duplicates, self.stall.resent),
                episodes=self.episode_errors.pending(),
            )

    def _carry_over(self, late: list[GroupResult]) -> None:
        """After the workers stopped: everything admitted and not trained goes into the run state."""
        for res in late:  # finished while stopping: keep them
            try:
                self.admission.accept(res)
            except Exception as e:  # it stays in flight: carried over like the others, not lost
                with self.sh.cond:
                    self.sh.errors.append(f"group {res.group_id} was not taken: {type(e).__name__}: {e}")
        self.counters.refresh(self.backend)
        with self.sh.cond:
            self.admission.stop_drawing()  # the admission thread, if a stop outlived its join
            self.state.finished = list(self.sh.buffer)
            self.state.unfinished = list(self.admission.readmit) + list(self.sh.inflight.values())
            self.ledger.carry_over()
            self.state.ledger = self.ledger.state_dict()
            self.state.staleness = self.staleness.state_dict()
            if self.drafts is not None:  # off: the drafts a resume restored are kept as saved
                self.state.drafts = self.drafts.state_dict()
            self.state.engine = self.sh.engine_counters()
            self.state.counters = self.counters.total(self.sh.duplicates, self.stall.resent)
            self.state.episodes = self.episode_errors.pending()
            errors, self.sh.errors = self.sh.errors, []
        for error in errors:  # arrived after the last batch was taken, or during a stop: never silent
            print(f"streamrl: warning: at the end of the run, {error}", file=sys.stderr, flush=True)
