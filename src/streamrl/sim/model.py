"""A discrete-event model of the RL pipeline: rollout engines, a trainer, weight sync, admission.

Time advances from event to event (a decode step or a trainer job ends, an engine becomes ready).
Work is measured in seconds on one unit of compute (one device, or one core in shared-core mode);
a running job progresses at `rate` units per wall second (processor sharing, see `_rates`).

Engine (continuous batching). A decode step over b running sequences costs

    chunk * (decode_step_s + decode_token_s * row_share * b)  +  prefill_token_s * (prompt tokens joining now)

and gives every running sequence `chunk` tokens (chunk = 1 is exact token-level decoding; larger
chunks trade resolution for speed on long sequences). At most `max_batch` sequences run; the rest
wait. Between steps an engine takes the newest published weights: `inflight` keeps the KV caches
(free), `interrupt` recomputes them (prefill_token_s * (prompt + generated) per running sequence).
Every token records the version of the weights that produced it. With shared_prefill a group's
prompt is charged once, also when its samples join in different steps. With cached_prefix P (the
engine's prefix cache) a prompt is charged prompt_len - P tokens, and the prefix's P tokens once per
engine and weights version, in the first step that prefills or recomputes under that version.
row_share (<= 1) is the KV-cache rows per running sequence the engine forwards: samples whose tokens so
far are identical share one row (a confident policy's repeated answers), measured by the run.

Trainer. A step on a batch of T tokens (prompt + response) with R ranks costs

    train_token_s * T / R + train_step_s + allreduce_s * 2 (R - 1) / R

then `weight_sync_s` (wall seconds) to publish; the version rises when the publish ends.

Admission. mode=async uses the project's StalenessManager: a group is admitted only while accepted +
running < (min(eta, v) + v + 1) * B, and a group whose oldest token is more than eta versions old at
training time is filtered (its slot freed); a batch takes first, and waits for, the groups on their last
version within the bound, as the runner does (loop/asynchronous.py). mode=sync and mode=partial run in
rounds: engines generate until B groups are finished, pause at the next step boundary while the trainer
trains, and resume under the new weights. sync keeps B groups in flight (generate-then-train); partial
(APRIL) keeps ceil(overprovision * B) in flight, trains the first B to finish and carries the rest, with
their tokens, into the next round. A group is filtered at completion with probability `filter_rate`
(DAPO dynamic sampling) and its slot goes to a new group.
"""

from __future__ import annotations

import copy
import math
import random
from collections import deque
from dataclasses import dataclass, field, replace

from streamrl.loop.staleness import StalenessManager, next_in_batch
from streamrl.sim.params import Costs, Setup, SimResult, Workload, validate

EPS = 1e-9


@dataclass
class _Group:
    gid: int
    size: int
    filtered: bool
    done: int = 0
    prefilled: bool = False  # shared_prefill: its prompt is already in the engine's cache
    tokens: int = 0  # prompt + response tokens over all samples (what the trainer trains)
    versions: dict[int, int] = field(default_factory=dict)  # policy version -> response tokens
    admitted_version: int = 0


@dataclass
class _Seq:
    group: _Group
    length: int
    made: int = 0


@dataclass
class _Engine:
    idx: int
    waiting: deque[_Seq] = field(default_factory=deque)
    running: list[_Seq] = field(default_factory=list)
    version: int = 0
    prefix_version: int = -1  # the weights version whose prefix KV this engine holds (cached_prefix)
    work: float = 0.0  # remaining work of the step in progress
    stepping: bool = False
    busy: float = 0.0


class _Sim:
    def __init__(self, costs: Costs, work: Workload, setup: Setup, trace: bool) -> None:
        # a private copy: a length model may keep state (Cycle), and every run starts from its beginning
        self.c, self.w, self.s = costs, replace(work, lengths=copy.deepcopy(work.lengths)), setup
        self.rng = random.Random(setup.seed)
        self.t = 0.0
        self.version = 0
        self.engines = [_Engine(i) for i in range(setup.engines)]
        self.buffer: deque[_Group] = deque()
        self.running_groups = 0
        self.in_flight: dict[int, _Group] = {}  # admitted, not returned
        self.admitted = 0
        self.staleness = StalenessManager(work.batch_groups, setup.eta)
        B = work.batch_groups
        self.round_limit = B if setup.mode == "sync" else math.ceil(setup.overprovision * B)
        self.job: str = ""  # trainer job in progress: "" | "train" | "sync"
        self.job_work = 0.0
        self.batch: list[_Group] = []
        self.trainer_busy = 0.0
        self.steps = 0
        self.hist: dict[int, int] = {}
        self.trained_tokens = 0
        self.generated = 0
        self.gen_wall = 0.0
        self.first_batch = -1.0
        self.filtered_stale = self.filtered_other = self.trained_groups = 0
        self.trace: list[tuple[float, str]] | None = [] if trace else None

    def log(self, what: str) -> None:
        if self.trace is not None:
            self.trace.append((round(self.t, 9), what))

    # ---- admission ----------------------------------------------------------------------------
    def _can_admit(self) -> bool:
        if self.s.mode == "async":
            return self.staleness.try_admit()
        return not self.job and self.ready() + self.running_groups < self.round_limit

    def admit(self) -> None:
        while self._can_admit():
            g = _Group(self.admitted, self.w.group_size, self.rng.random() < self.w.filter_rate)
            g.admitted_version = self.version
            self.in_flight[g.gid] = g
            self.admitted += 1
            self.running_groups += 1
            eng = min(self.engines, key=lambda e: (len(e.running) + len(e.waiting), e.idx))
            for _ in range(g.size):
                n = max(1, int(self.w.lengths.sample(self.version, self.rng)))
                eng.waiting.append(_Seq(g, n))
            self.log(f"admit g{g.gid} e{eng.idx} v{self.version}")

    # ---- engines ------------------------------------------------------------------------------
    def ready(self) -> int:
        """Finished groups waiting to be trained (in the buffer or already taken for the next batch)."""
        return len(self.buffer) + (0 if self.job else len(self.batch))

    def paused(self) -> bool:
        """Rounds: engines stop at a step boundary while a batch is ready or being trained."""
        return self.s.mode != "async" and (bool(self.job) or self.ready() >= self.w.batch_groups)

    def start_engines(self) -> None:
        if self.t < self.c.startup_s - EPS or self.paused():
            return
        c, w = self.c, self.w
        for e in self.engines:
            if e.stepping or not (e.running or e.waiting):
                continue
            work = 0.0
            own = w.prompt_len - w.cached_prefix  # what each prefill forwards after the cached prefix
            prefilled = 0  # prompts prefilled or recomputed in this step
            if e.version < self.version:
                if self.s.weight_update == "interrupt":
                    work += c.prefill_token_s * sum(own + q.made for q in e.running)
                    prefilled += len(e.running)
                e.version = self.version
            while e.waiting and len(e.running) < w.max_batch:
                q = e.waiting.popleft()
                e.running.append(q)
                if not (w.shared_prefill and q.group.prefilled):
                    work += c.prefill_token_s * own
                    prefilled += 1
                    q.group.prefilled = True
            if prefilled and w.cached_prefix and e.prefix_version != e.version:
                work += c.prefill_token_s * w.cached_prefix
                e.prefix_version = e.version
            work += self.s.chunk * (c.decode_step_s + c.decode_token_s * w.row_share * len(e.running))
            e.work, e.stepping = work, True

    def finish_step(self, e: _Engine) -> None:
        e.stepping = False
        still: list[_Seq] = []
        for q in e.running:
            n = min(self.s.chunk, q.length - q.made)
            q.made += n
            self.generated += n
            q.group.versions[e.version] = q.group.versions.get(e.version, 0) + n
            if q.made < q.length:
                still.append(q)
                continue
            g = q.group
            g.done += 1
            g.tokens += self.w.prompt_len + q.length
            if g.done == g.size:
                self.group_done(g)
        e.running = still

    def group_done(self, g: _Group) -> None:
        self.running_groups -= 1
        del self.in_flight[g.gid]
        if self.s.mode == "async":
            self.staleness.on_return(kept=not g.filtered)
        if g.filtered:
            self.filtered_other += 1
            self.log(f"filtered g{g.gid}")
        else:
            self.buffer.append(g)
            self.log(f"done g{g.gid}")

    # ---- trainer ------------------------------------------------------------------------------
    def start_trainer(self) -> None:
        if self.job:
            return
        if self.s.mode != "async" and any(e.stepping for e in self.engines):
            return  # rounds: wait for the engines to reach a step boundary
        B = self.w.batch_groups
        while len(self.batch) < B and (g := self._pick(B - len(self.batch))) is not None:
            if self.s.mode == "async" and self.version - min(g.versions) > self.s.eta:
                self.filtered_stale += 1
                self.staleness.release_accepted()
                self.log(f"stale g{g.gid}")
                continue
            self.batch.append(g)
        if len(self.batch) < B:
            return
        c, R = self.c, self.s.ranks
        tokens = sum(g.tokens for g in self.batch)
        self.job_work = c.train_token_s * tokens / R + c.train_step_s + c.allreduce_s * 2 * (R - 1) / R
        self.job = "train"
        for g in self.batch:
            for v, n in g.versions.items():
                self.hist[self.version - v] = self.hist.get(self.version - v, 0) + n
        self.trained_tokens += tokens
        if self.first_batch < 0:
            self.first_batch = self.t
        self.log(f"train v{self.version} [{' '.join(f'g{g.gid}' for g in self.batch)}]")

    def _pick(self, room: int) -> _Group | None:
        """The next buffered group for the batch, or None to wait. Rounds: the order they finished in.
        async: the runner's rule (AsyncRunner._pick): groups on their last version within the bound
        first, waited for while at least `room` of them are generating; then the oldest, first finished."""
        if self.s.mode != "async":
            return self.buffer.popleft() if self.buffer else None
        v = self.version
        oldest = [min(g.versions, default=v) for g in self.buffer]
        running = (g.admitted_version for g in self.in_flight.values())
        i = next_in_batch(oldest, running, v, self.s.eta, room)
        if i is None:
            return None
        g = self.buffer[i]
        del self.buffer[i]
        return g

    def finish_job(self) -> None:
        if self.job == "train":
            self.job, self.job_work = "sync", self.c.weight_sync_s
            return
        self.job = ""
        self.trained_groups += len(self.batch)
        self.batch = []
        self.version += 1
        self.steps += 1
        self.staleness.set_version(self.version)
        self.log(f"published v{self.version}")

    # ---- time ---------------------------------------------------------------------------------
    def rates(self) -> tuple[list[float], float]:
        """Progress per wall second of each stepping engine and of the trainer job.

        Devices: 1. Shared cores C: k threads run at k ** alpha * min(1, C / D) (alpha: decode_ or
        thread_scaling), D = threads demanded by every active component, / (1 + contention * (active - 1)).
        Elastic: a trainer with no job lends its threads to the stepping engines (split evenly), and
        idle engines lend theirs to a training trainer (placement/cores.py).
        Weight sync is a fixed wall time (rate 1)."""
        active_e = [e for e in self.engines if e.stepping]
        n_train = int(self.job == "train")
        C = self.s.shared_cores
        if C == 0:
            return [1.0] * len(active_e), 1.0
        et, tt = float(self.s.engine_threads), float(self.s.trainer_threads)
        if self.s.elastic and active_e and not self.job:
            et += tt / len(active_e)
        if self.s.elastic and n_train:
            tt += et * (len(self.engines) - len(active_e))
        demand = len(active_e) * et + n_train * tt
        share = min(1.0, C / demand) if demand else 1.0
        slow = 1.0 + self.s.contention * max(0, len(active_e) + n_train - 1)
        a = self.s.thread_scaling
        ad = a if self.s.decode_thread_scaling is None else self.s.decode_thread_scaling
        er = et**ad * share / slow
        tr = tt**a * share / slow if n_train else 1.0
        return [er] * len(active_e), tr

    def advance(self) -> None:
        active_e = [e for e in self.engines if e.stepping]
        erates, trate = self.rates()
        cands = [e.work / r for e, r in zip(active_e, erates)]
        if self.job:
            cands.append(self.job_work / trate)
        if self.t < self.c.startup_s - EPS:
            cands.append(self.c.startup_s - self.t)
        if not cands:
            raise RuntimeError(f"simulation stalled at t={self.t:.3f}: nothing can run (step {self.steps})")
        dt = max(0.0, min(cands))
        self.t += dt
        if active_e:
            self.gen_wall += dt
        for e, r in zip(active_e, erates):
            e.work -= dt * r
            e.busy += dt
        if self.job:
            self.job_work -= dt * trate
            self.trainer_busy += dt
        for e in active_e:
            if e.work <= EPS:
                self.finish_step(e)
        if self.job and self.job_work <= EPS:
            self.finish_job()

    def run(self) -> SimResult:
        limit = 10_000_000
        while self.steps < self.s.steps:
            self.admit()
            self.start_trainer()
            self.start_engines()
            self.advance()
            limit -= 1
            if limit == 0:
                raise RuntimeError("simulation exceeded 10M events; use a larger chunk")
        T = max(self.t, EPS)
        samples = self.steps * self.w.batch_groups * self.w.group_size
        carried = self.running_groups + len(self.buffer) + len(self.batch)
        return SimResult(
            time=self.t,
            samples=samples,
            samples_per_s=samples / T,
            trained_tokens_per_s=self.trained_tokens / T,
            gen_tokens_per_s=self.generated / max(self.gen_wall, EPS),
            trainer_idle=max(0.0, 1.0 - self.trainer_busy / T),
            engine_idle=max(0.0, 1.0 - sum(e.busy for e in self.engines) / (T * len(self.engines))),
            staleness_hist=dict(sorted(self.hist.items())),
            groups_admitted=self.admitted,
            groups_trained=self.trained_groups,
            filtered_stale=self.filtered_stale,
            filtered_other=self.filtered_other,
            groups_in_flight=carried,
            first_batch_s=self.first_batch,
            trace=self.trace or [],
        )


def simulate(costs: Costs, work: Workload, setup: Setup, trace: bool = False) -> SimResult:
    """Run the model until `setup.steps` trainer steps have published; deterministic in setup.seed."""
    validate(work, setup)
    return _Sim(costs, work, setup, trace).run()
