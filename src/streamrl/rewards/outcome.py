"""The scalar reward of one response: correctness (0/1, or the task's own value in [0, 1] such as the
code task's fraction of tests passed) plus a weighted format bonus."""

from __future__ import annotations

from typing import Any

from streamrl.data.tasks import Task
from streamrl.types import Problem


def outcome_reward(
    task: Task, problem: Problem, text: str, format_weight: float
) -> tuple[float, bool, dict[str, Any]]:
    """-> (reward, correct, info). reward = value + format_weight * 1[format followed], where value =
    score.value when the task gives one, else 1[correct]."""
    s = task.score(problem, text)
    value = float(s.correct) if s.value is None else s.value
    reward = value + format_weight * float(s.formatted)
    return reward, s.correct, {"extracted": s.extracted, "formatted": s.formatted}
