"""Samplers: which problem is rolled out next, with feedback from every scored group.

A sampler is an iterator of problems over the task's training stream (`base`) plus `observe(group)`,
which the loops call once per scored group (trained or filtered). Selected by `rollout.sampler`:

- uniform: the stream's own order.
- mopps (MoPPS, model-predictive prompt selection): each prompt i has a Beta(a_i, b_i) posterior of its
  success rate, from a Beta(1, 1) prior, updated by a group of n samples with s successes as
      a_i <- lam * a_i + s,    b_i <- lam * b_i + (n - s)        (lam = 1: no forgetting)
  A pool of K candidates is kept filled from the stream. Each draw samples theta_i ~ Beta(a_i, b_i)
  for every candidate and returns  argmin_i |theta_i - target|  (Thompson sampling toward
  target = 0.5, where the group-relative advantage has the most signal). The chosen prompt stays in
  the pool, so it can be revisited with what was learned; it retires after `max_draws` draws, and a
  candidate whose posterior mean has left [target - band, target + band] is replaced by a fresh one.
  Posteriors of retired prompts are remembered, so a finite dataset's prompts start the next epoch
  with them.
- online_filter (balanced online difficulty filtering): a prompt whose last observed pass rate was 0
  or 1 is skipped when the stream offers it again (epochs of a finite dataset); after `recheck` skips
  it is re-measured. A stream that never repeats a prompt (reasoning-gym) passes through unchanged.
- curriculum: a reasoning-gym curriculum; when the accuracy of the last W samples reaches the
  threshold, one attribute's level is raised (round robin) and the stream restarts at the new level.

Resume: `state_dict()` holds plain JSON (positions in the base stream, posteriors, levels, RNG); the
problems of the pool are re-drawn from the deterministic stream by their positions. `state_at_mark()`
is the state as of the last `mark()`: MoPPS rebuilds its posteriors only then (data/bounded_memory.py).
"""

from __future__ import annotations

import copy
import random
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from streamrl.data.bounded_memory import BoundedMemory
from streamrl.data.prompt_limit import PromptFilter
from streamrl.types import Group, Problem

MAX_SKIPS = 10_000  # consecutive skips before a filter gives up and returns the next problem anyway
MEMORY = 100_000  # posteriors / pass rates remembered (oldest forgotten first)


def _rng_state(state: tuple[Any, ...]) -> list[Any]:
    """A random.Random's getstate() as JSON."""
    v, internal, gauss = state
    return [v, list(internal), gauss]


def _set_rng(rng: random.Random, s: list[Any]) -> None:
    rng.setstate((s[0], tuple(s[1]), s[2]))


class Sampler:
    """Uniform: the base stream as it comes. Subclasses choose and learn from feedback."""

    def __init__(self, base: Iterator[Problem]) -> None:
        self.base = base
        self.base_drawn = 0  # position in the base stream (what a resume skips to)
        self.last_id = ""  # the id of the problem at that position (what a resume checks it reached)
        self.lock = threading.Lock()  # next() runs in the admission thread, metrics() in the trainer's
        self._marked: dict[str, Any] | None = None  # state_dict() at the last mark()

    def _pull(self) -> Problem:
        self.base_drawn += 1
        p = next(self.base)
        self.last_id = p.id
        return p

    def _position(self) -> dict[str, Any]:
        return {"base_drawn": self.base_drawn, "last_id": self.last_id}

    def _check_position(self, d: dict[str, Any]) -> None:
        """After a resume re-drew the saved number of problems: the last one must be the one the run
        drew there. Another means the stream changed under the run: its data, or what decides which
        prompts are skipped as too long (data/prompt_limit.py). States saved without an id pass."""
        saved = d.get("last_id")
        if saved and saved != self.last_id:
            raise ValueError(
                f"resume: the training stream's problem {self.base_drawn} is '{self.last_id}', the run drew "
                f"'{saved}' there: its data changed, or a setting that decides which prompts are too long "
                "(task_config.max_prompt_tokens, rollout.max_new_tokens, train.token_budget, the system "
                "prompt or chat template); resume with the run's own data and settings, or start a new run "
                "from its checkpoint"
            )

    def __iter__(self) -> Sampler:
        return self

    def __next__(self) -> Problem:
        with self.lock:
            return self._pull()

    def observe(self, group: Group) -> None:
        """Feedback: one scored group (its samples' `correct`)."""

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return self._position()

    def load_state_dict(self, d: dict[str, Any]) -> None:
        for _ in range(int(d["base_drawn"])):
            self._pull()
        self._check_position(d)
        self._marked = None

    def mark(self) -> None:
        """Remember this point: `state_at_mark()` is the state_dict as of now, until the next mark."""
        self._marked = self.state_dict()

    def state_at_mark(self) -> dict[str, Any]:
        """The state_dict as of the last mark (as of now if never marked)."""
        return self.state_dict() if self._marked is None else self._marked


def _successes(group: Group) -> tuple[int, int]:
    return sum(bool(t.correct) for t in group.trajectories), len(group.trajectories)


@dataclass
class _Candidate:
    problem: Problem
    position: int  # index in the base stream
    draws: int = 0


class MoPPSSampler(Sampler):
    def __init__(
        self,
        base: Iterator[Problem],
        pool: int = 64,
        target: float = 0.5,
        seed: int = 0,
        max_draws: int = 8,
        band: float = 0.3,
        lam: float = 1.0,
    ) -> None:
        super().__init__(base)
        self.K, self.target, self.max_draws, self.band, self.lam = pool, target, max_draws, band, lam
        self.pool: OrderedDict[str, _Candidate] = OrderedDict()
        self.post: BoundedMemory[list[float]] = BoundedMemory(MEMORY)  # id -> [a, b]
        self.rng = random.Random(seed)
        self.draws = self.retired = self.evicted = 0

    def _ab(self, pid: str) -> list[float]:
        return self.post.get(pid, [1.0, 1.0])

    def _mean(self, pid: str) -> float:
        a, b = self._ab(pid)
        return a / (a + b)

    def _fill(self) -> None:
        """Pull candidates until the pool holds K, or until a pull finds one the pool holds: the stream
        came round (a dataset smaller than the pool never fills it, and every draw would pull K)."""
        for _ in range(self.K):
            if len(self.pool) >= self.K:
                return
            pos = self.base_drawn
            p = self._pull()
            if p.id in self.pool:
                return
            self.pool[p.id] = _Candidate(p, pos)

    def __next__(self) -> Problem:
        with self.lock:
            self._fill()
            ids = list(self.pool)
            theta = [self.rng.betavariate(*self._ab(i)) for i in ids]
            best = min(range(len(ids)), key=lambda j: abs(theta[j] - self.target))
            cand = self.pool[ids[best]]
            cand.draws += 1
            self.draws += 1
            if cand.draws >= self.max_draws:
                del self.pool[ids[best]]
                self.retired += 1
            return cand.problem

    def observe(self, group: Group) -> None:
        s, n = _successes(group)
        pid = group.problem.id
        with self.lock:
            a, b = self._ab(pid)
            self.post.put(pid, [self.lam * a + s, self.lam * b + (n - s)])
            if pid in self.pool and abs(self._mean(pid) - self.target) > self.band:
                del self.pool[pid]  # saturated (too easy or too hard): make room for a fresh prompt
                self.evicted += 1

    def metrics(self) -> dict[str, float]:
        with self.lock:
            means = [self._mean(i) for i in self.pool]
            return {
                "sampler_pool_size": float(len(self.pool)),
                "sampler_pool_success_mean": sum(means) / max(len(means), 1),
                "sampler_evicted": float(self.evicted),
                "sampler_retired": float(self.retired),
            }

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return self._state(self._small(), self.post.items())

    def _small(self) -> dict[str, Any]:
        """The state but its posteriors, with the RNG's own tuple: what a mark copies."""
        pool = [[c.position, c.draws] for c in self.pool.values()]
        counts = [self.draws, self.retired, self.evicted]
        return {**self._position(), "pool": pool, "post": [], "rng": self.rng.getstate(), "counts": counts}

    @staticmethod
    def _state(small: dict[str, Any], post: Iterable[tuple[str, list[float]]]) -> dict[str, Any]:
        return {**small, "post": [[k, v[0], v[1]] for k, v in post], "rng": _rng_state(small["rng"])}

    def mark(self) -> None:
        with self.lock:
            self._marked = self._small()
            self.post.mark()  # the posteriors as of now are rebuilt by state_at_mark, not copied

    def state_at_mark(self) -> dict[str, Any]:
        with self.lock:
            return self._state(self._marked or self._small(), self.post.items_at_mark())

    def load_state_dict(self, d: dict[str, Any]) -> None:
        wanted = {int(pos): int(draws) for pos, draws in d["pool"]}
        for pos in range(int(d["base_drawn"])):
            p = self._pull()
            if pos in wanted:
                self.pool[p.id] = _Candidate(p, pos, wanted[pos])
        self._check_position(d)
        self.post = BoundedMemory(MEMORY, ((k, [float(a), float(b)]) for k, a, b in d["post"]))
        _set_rng(self.rng, d["rng"])
        self.draws, self.retired, self.evicted = d["counts"]
        self._marked = None


class OnlineFilterSampler(Sampler):
    def __init__(self, base: Iterator[Problem], recheck: int = 2) -> None:
        super().__init__(base)
        self.recheck = recheck
        self.rate: OrderedDict[str, float] = OrderedDict()  # id -> pass rate of its last group
        self.skips: dict[str, int] = {}
        self.skipped = self.forced = 0

    def __next__(self) -> Problem:
        with self.lock:
            for _ in range(MAX_SKIPS):
                p = self._pull()
                if self.rate.get(p.id) not in (0.0, 1.0):
                    return p
                self.skipped += 1
                self.skips[p.id] = self.skips.get(p.id, 0) + 1
                if self.skips[p.id] >= self.recheck:  # measure it again next time it comes
                    del self.rate[p.id], self.skips[p.id]
            self.forced += 1  # every prompt saturated: train on one rather than stall
            return self._pull()

    def observe(self, group: Group) -> None:
        s, n = _successes(group)
        with self.lock:
            self.rate[group.problem.id] = s / max(n, 1)
            self.rate.move_to_end(group.problem.id)
            if len(self.rate) > MEMORY:
                self.rate.popitem(last=False)

    def metrics(self) -> dict[str, float]:
        return {"sampler_skipped": float(self.skipped), "sampler_forced": float(self.forced)}

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                **self._position(),
                "rate": list(self.rate.items()),
                "skips": dict(self.skips),  # a copy: the caller writes it later, as taken now
                "counts": [self.skipped, self.forced],
            }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self.rate = OrderedDict((k, float(v)) for k, v in d["rate"])
        self.skips = {k: int(v) for k, v in d["skips"].items()}
        self.skipped, self.forced = d["counts"]


def check_curriculum(dataset: str) -> None:
    """One line (ValueError) when reasoning-gym has no curriculum for `dataset` (preflight asks first)."""
    from reasoning_gym.factory import has_curriculum

    if not has_curriculum(dataset):
        raise ValueError(
            f"rollout.sampler=curriculum: reasoning-gym has no curriculum for '{dataset}': choose another "
            "rg: task or another rollout.sampler"
        )


class CurriculumSampler(Sampler):
    """`make_stream(args, raises)`: the reasoning-gym training stream with generator args at a level."""

    def __init__(
        self,
        dataset: str,
        make_stream: Callable[[dict[str, Any], int], Iterator[Problem]],
        threshold: float,
        window: int,
    ) -> None:
        from reasoning_gym.factory import create_curriculum

        check_curriculum(dataset)
        self.curriculum = create_curriculum(dataset)
        self.attrs = list(self.curriculum.attributes)
        self.make_stream, self.threshold = make_stream, threshold
        self.recent: deque[bool] = deque(maxlen=window)
        self.raises = 0  # level increments so far (round robin over attributes)
        super().__init__(make_stream(self.args(), 0))

    def args(self) -> dict[str, Any]:
        """The generator args of the current levels (the config dataclass minus seed and size)."""
        cfg = self.curriculum.generate_configuration()
        return {k: v for k, v in vars(cfg).items() if k not in ("seed", "size")}

    def levels(self) -> dict[str, int]:
        return {a: self.curriculum.get_attr_level(a) for a in self.attrs}

    def _raise(self) -> bool:
        for k in range(len(self.attrs)):  # the next attribute not yet at its top level
            attr = self.attrs[(self.raises + k) % len(self.attrs)]
            if self.curriculum.get_attr_level(attr) < len(self.curriculum.attributes[attr].levels) - 1:
                self.curriculum.increment_attr_level(attr)
                self.raises += k + 1
                return True
        return False

    def _restart(self) -> None:
        self.base, self.base_drawn, self.last_id = self.make_stream(self.args(), self.raises), 0, ""
        self.recent.clear()

    def observe(self, group: Group) -> None:
        with self.lock:
            self.recent.extend(bool(t.correct) for t in group.trajectories)
            full = len(self.recent) == self.recent.maxlen
            if full and sum(self.recent) / len(self.recent) >= self.threshold and self._raise():
                self._restart()

    def metrics(self) -> dict[str, float]:
        with self.lock:
            acc = sum(self.recent) / len(self.recent) if self.recent else 0.0
            return {"curriculum_level": float(sum(self.levels().values())), "curriculum_accuracy": acc}

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                **self._position(),
                "raises": self.raises,
                "levels": self.levels(),
                "recent": [int(x) for x in self.recent],
            }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        for attr, level in d["levels"].items():
            self.curriculum.set_attr_level(attr, int(level))
        self.raises = int(d["raises"])
        self._restart()
        self.recent.extend(bool(x) for x in d["recent"])
        super().load_state_dict(d)


def make_sampler(
    cfg: Any, task: Any, seed: int, exclude: set[str], prompts: PromptFilter | None = None
) -> Sampler:
    """The sampler `rollout.sampler` names, over `task.train_stream(seed, exclude)` (through `prompts`,
    which skips prompts too long to train on, when given)."""
    r = cfg.rollout

    def fitting(stream: Iterator[Problem]) -> Iterator[Problem]:
        return prompts.apply(stream) if prompts is not None else stream

    if r.sampler == "curriculum":
        from streamrl.data.reasoning_gym import ReasoningGymTask

        if not isinstance(task, ReasoningGymTask):
            raise ValueError(
                f"rollout.sampler=curriculum needs a reasoning-gym task (task=rg:NAME), got {task.name}"
            )

        def stream(args: dict[str, Any], raises: int) -> Iterator[Problem]:
            level_task = copy.copy(task)  # the held-out set keeps the task's own args
            level_task.args = args
            return fitting(level_task.train_stream(seed + 7919 * raises, exclude))

        return CurriculumSampler(task.dataset, stream, r.curriculum_threshold, r.curriculum_window)
    base = fitting(task.train_stream(seed, exclude))
    if r.sampler == "mopps":
        return MoPPSSampler(base, r.sampler_pool, r.sampler_target, seed)
    if r.sampler == "online_filter":
        return OnlineFilterSampler(base)
    return Sampler(base)
