"""A single rich progress bar: step, mean reward, accuracy, tokens/s and ETA."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text


class RemainingColumn(ProgressColumn):
    """The time left: the steps left at the steps' pace, or what is left of max_time if that ends the run
    sooner (a run bounded by time has a nominal step count far beyond what it will reach)."""

    max_refresh = 0.5

    def __init__(self, deadline: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.deadline, self.clock = deadline, clock

    def render(self, task: Task) -> Text:
        left = task.time_remaining
        if self.deadline is not None:
            budget = max(0.0, self.deadline - self.clock())
            left = budget if left is None else min(left, budget)
        if left is None:
            return Text("-:--:--", style="progress.remaining")
        return Text(str(timedelta(seconds=int(left))), style="progress.remaining")


class StepProgress:
    def __init__(self, total: int, console: Console, done: int = 0, max_time: float = 0.0) -> None:
        """total: max_steps; done: steps already trained (a resume); max_time: the run's time limit in
        seconds from now (0: none)."""
        deadline = time.monotonic() + max_time if max_time > 0 else None
        self.progress = Progress(
            TextColumn("[bold]train[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "reward {task.fields[reward]:.3f}  acc {task.fields[acc]:.3f}  {task.fields[tps]:.0f} tok/s"
            ),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            RemainingColumn(deadline),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("train", total=total, completed=done, reward=0.0, acc=0.0, tps=0.0)

    def __enter__(self) -> StepProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def update(self, record: dict[str, Any]) -> None:
        self.progress.update(
            self.task,
            advance=1,
            reward=record.get("reward_mean", 0.0),
            acc=record.get("accuracy", 0.0),
            tps=record.get("tokens_per_s", 0.0),
        )
