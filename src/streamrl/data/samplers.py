"""Samplers: which problem is rolled out next, with feedback from every scored group.

A sampler is an iterator of problems over the task's training stream (`base`) plus `observe(group)`,
which the loops call once per scored group (trained or filtered); the base class and its resume
protocol are in data/sampler_base.py. Selected by `rollout.sampler`:

- uniform: the stream's own order (data/sampler_base.py).
- mopps (MoPPS, model-predictive prompt selection): Thompson sampling of a pool of prompts toward a
  target success rate, from each prompt's Beta posterior (data/mopps.py).
- online_filter (balanced online difficulty filtering): a prompt whose last observed pass rate was 0
  or 1 is skipped when the stream offers it again (epochs of a finite dataset); after `recheck` skips
  it is re-measured. A stream that never repeats a prompt (reasoning-gym) passes through unchanged.
- curriculum: a reasoning-gym curriculum; when the accuracy of the last W samples reaches the
  threshold, one attribute's level is raised (round robin) and the stream restarts at the new level.

Resume: `state_dict()` holds plain JSON (positions in the base stream, posteriors, pass rates, levels,
RNG). `state_at_mark()` is the state as of the last `mark()`: MoPPS and online_filter rebuild what they
remember per prompt only then (data/bounded_memory.py), so a mark costs no copy of it.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from streamrl.data.bounded_memory import BoundedMemory
from streamrl.data.mopps import MoPPSSampler
from streamrl.data.prompt_limit import PromptFilter
from streamrl.data.sampler_base import MEMORY, Sampler, successes
from streamrl.types import Group, Problem

__all__ = [
    "MEMORY",
    "CurriculumSampler",
    "MoPPSSampler",
    "OnlineFilterSampler",
    "Sampler",
    "check_curriculum",
    "make_sampler",
]

MAX_SKIPS = 10_000  # consecutive skips before a filter gives up and returns the next problem anyway
UNBOUNDED = 2**63  # the skip counts: one per prompt skipped and not yet re-measured, none forgotten


class OnlineFilterSampler(Sampler):
    def __init__(self, base: Iterator[Problem], recheck: int = 2) -> None:
        super().__init__(base)
        self.recheck = recheck
        self.rate: BoundedMemory[float] = BoundedMemory(MEMORY)  # id -> pass rate of its last group
        self.skips: BoundedMemory[int] = BoundedMemory(UNBOUNDED)  # id -> times skipped since
        self.skipped = self.forced = 0

    def __next__(self) -> Problem:
        with self.lock:
            for _ in range(MAX_SKIPS):
                p = self._pull()
                if self.rate.get(p.id) not in (0.0, 1.0):
                    return p
                self.skipped += 1
                self.skips.put(p.id, self.skips.get(p.id, 0) + 1)
                if self.skips[p.id] >= self.recheck:  # measure it again next time it comes
                    self.rate.pop(p.id)
                    self.skips.pop(p.id)
            self.forced += 1  # every prompt saturated: train on one rather than stall
            return self._pull()

    def observe(self, group: Group) -> None:
        s, n = successes(group)
        with self.lock:
            self.rate.put(group.problem.id, s / max(n, 1))  # the least recent past MEMORY is forgotten

    def metrics(self) -> dict[str, float]:
        return {"sampler_skipped": float(self.skipped), "sampler_forced": float(self.forced)}

    def _small(self) -> dict[str, Any]:
        """The state but what it remembers per prompt: what a mark copies."""
        return {**self._position(), "rate": [], "skips": {}, "counts": [self.skipped, self.forced]}

    @staticmethod
    def _state(
        small: dict[str, Any], rate: Iterable[tuple[str, float]], skips: Iterable[tuple[str, int]]
    ) -> dict[str, Any]:
        # copies: the caller writes the state later, as taken now
        return {**small, "rate": list(rate), "skips": dict(skips)}

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return self._state(self._small(), self.rate.items(), self.skips.items())

    def mark(self) -> None:
        with self.lock:
            self._marked = self._small()
            self.rate.mark()  # the pass rates and skips as of now are rebuilt by state_at_mark, not copied
            self.skips.mark()

    def state_at_mark(self) -> dict[str, Any]:
        with self.lock:
            small = self._marked or self._small()
            return self._state(small, self.rate.items_at_mark(), self.skips.items_at_mark())

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self.rate = BoundedMemory(MEMORY, ((k, float(v)) for k, v in d["rate"]))
        self.skips = BoundedMemory(UNBOUNDED, ((k, int(v)) for k, v in d["skips"].items()))
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
