"""A single rich progress bar: step, mean reward, accuracy, tokens/s and ETA."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class StepProgress:
    def __init__(self, total: int, console: Console, done: int = 0) -> None:
        self.progress = Progress(
            TextColumn("[bold]train[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "reward {task.fields[reward]:.3f}  acc {task.fields[acc]:.3f}  {task.fields[tps]:.0f} tok/s"
            ),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
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
