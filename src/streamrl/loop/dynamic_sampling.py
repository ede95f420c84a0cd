"""DAPO's dynamic sampling, the one rule both loops apply to each returned group."""

from __future__ import annotations

from typing import Any

from streamrl.algo.registry import ADVANTAGES
from streamrl.types import Group


def applies(cfg: Any) -> bool:
    """rollout.dynamic_sampling, where the advantage estimator gives a group of equal rewards zero
    advantage (a group baseline); with a batch baseline or a value head such a group still has one, and
    none is dropped."""
    return cfg.rollout.dynamic_sampling and ADVANTAGES[cfg.advantage.name].group_baseline


class DynamicSampling:
    """Groups whose rewards are all equal have zero advantage and teach nothing: drop them, so their slot
    goes to a fresh group. At most `rounds * batch` groups are dropped per step, so a saturated task
    (every group all-right or all-wrong) cannot stall training: past the budget such groups are kept.
    Disabled, every group is kept."""

    def __init__(self, enabled: bool, batch: int, rounds: int) -> None:
        self.enabled = enabled
        self.budget = rounds * batch
        self.dropped = 0  # this step

    def keep(self, group: Group) -> bool:
        if self.enabled and group.uninformative and self.dropped < self.budget:
            self.dropped += 1
            return False
        return True

    def next_step(self) -> None:
        self.dropped = 0
