"""The scalar reward of one response: correctness (0/1) plus a weighted format bonus."""

from __future__ import annotations

from typing import Any

from streamrl.data.tasks import Task
from streamrl.types import Problem


def outcome_reward(
    task: Task, problem: Problem, text: str, format_weight: float
) -> tuple[float, bool, dict[str, Any]]:
    """-> (reward, correct, info). reward = 1[correct] + format_weight * 1[format followed]."""
    s = task.score(problem, text)
    reward = float(s.correct) + format_weight * float(s.formatted)
    return reward, s.correct, {"extracted": s.extracted, "formatted": s.formatted}
