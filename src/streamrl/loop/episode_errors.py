"""Agent episodes that ended in an error, counted per step by reason (both loops).

Every returned group is counted, also one that is then filtered or holds no trajectory: an episode
that failed on its first call leaves nothing to train on and would otherwise vanish. The step record
gets `episodes` (agent episodes returned since the previous step), `episode_errors` and
`episode_error_reasons` ({exception type: count}), `episode_error_examples` ({exception type: its
first message since the previous step}); the `episode_errors` diagnostics rule warns when
the share is high. What was counted after the last step when the run stops goes into the run state
(`pending`), and the resumed run's first step record includes it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from streamrl.loop.step_metrics import first_messages
from streamrl.types import Group


class EpisodeErrors:
    """active: the run's task is an agent task (its records always carry the three keys); pending: the
    counts a stopped run had not logged yet (`pending()` of its state)."""

    def __init__(self, active: bool, pending: dict[str, Any] | None = None) -> None:
        self.active = active
        self.episodes = int((pending or {}).get("episodes", 0))
        self.reasons: Counter[str] = Counter((pending or {}).get("reasons", {}))
        self.examples: dict[str, str] = dict((pending or {}).get("examples", {}))

    def pending(self) -> dict[str, Any]:
        """The counts since the last take, for the run state."""
        if not self.episodes:
            return {}
        out = {"episodes": self.episodes, "reasons": dict(self.reasons)}
        return {**out, "examples": dict(self.examples)} if self.examples else out

    def add(self, group: Group) -> None:
        """Count a returned group's episodes: all of them or, if this raises, none."""
        if group.episode_errors is None:  # not an agent group
            return
        details = group.episode_error_details or [""] * len(group.episode_errors)
        examples = first_messages(zip(group.episode_errors, details), self.examples)
        reasons = Counter(reason for reason in group.episode_errors if reason)
        self.episodes += len(group.episode_errors)
        self.reasons.update(reasons)
        self.examples = examples

    def take(self) -> dict[str, Any]:
        """The counts since the last take (nothing for runs without agent tasks), then reset."""
        if not self.active:
            return {}
        out = {
            "episodes": self.episodes,
            "episode_errors": sum(self.reasons.values()),
            "episode_error_reasons": dict(sorted(self.reasons.items())),
            "episode_error_examples": dict(sorted(self.examples.items())),
        }
        self.episodes = 0
        self.reasons = Counter()
        self.examples = {}
        return out
