"""The sampler every `rollout.sampler` builds on (data/samplers.py): an iterator of problems over the
task's training stream (`base`) plus `observe(group)`, which the loops call once per scored group
(trained or filtered). This one is `rollout.sampler=uniform`: the stream's own order, no feedback.

Resume: `state_dict()` holds plain JSON, its position in the base stream first (what a resume re-draws
to, and checks it reached). `state_at_mark()` is the state as of the last `mark()`: a loop marks the
start of a step whose problems are drawn again on resume if it fails (loop/colocated.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from streamrl.types import Group, Problem

MEMORY = 100_000  # posteriors / pass rates remembered (oldest forgotten first)


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


def successes(group: Group) -> tuple[int, int]:
    return sum(bool(t.correct) for t in group.trajectories), len(group.trajectories)
