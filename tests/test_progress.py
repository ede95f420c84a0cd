"""The progress bar's ETA: the steps left at the steps' pace, or what is left of max_time when the time
limit ends the run first."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress

from streamrl.observe.progress import RemainingColumn, StepProgress


def _task_at(now: list[float], total: int, steps: int, step_s: float):
    """A task that has done `steps` steps of `total`, one every `step_s` seconds of the fake clock."""
    progress = Progress(get_time=lambda: now[0])
    task_id = progress.add_task("train", total=total)
    for _ in range(steps):
        now[0] += step_s
        progress.advance(task_id)
    return progress.tasks[0]


def test_without_a_time_limit_the_eta_is_the_steps_left_at_their_pace() -> None:
    now = [0.0]
    task = _task_at(now, total=20, steps=10, step_s=3.0)
    assert str(RemainingColumn().render(task)) == "0:00:30"  # 10 steps at 3 s


def test_a_time_limit_that_ends_the_run_first_gives_the_eta() -> None:
    now = [0.0]
    task = _task_at(now, total=100000, steps=10, step_s=3.0)  # 99990 steps at 3 s: 83 h
    column = RemainingColumn(deadline=130.0, clock=lambda: now[0])  # 30 s done, 100 s left
    assert str(column.render(task)) == "0:01:40"
    now[0] = 200.0  # past the limit: the run ends at its current step
    assert str(column.render(task)) == "0:00:00"


def test_a_far_time_limit_leaves_the_steps_eta() -> None:
    now = [0.0]
    task = _task_at(now, total=20, steps=10, step_s=3.0)
    assert str(RemainingColumn(deadline=3600.0, clock=lambda: now[0]).render(task)) == "0:00:30"


def test_before_any_step_the_eta_is_the_time_limit_or_unknown() -> None:
    now = [0.0]
    task = _task_at(now, total=20, steps=0, step_s=3.0)
    assert str(RemainingColumn().render(task)) == "-:--:--"
    assert str(RemainingColumn(deadline=90.0, clock=lambda: now[0]).render(task)) == "0:01:30"


def test_the_bar_reads_max_time() -> None:
    console = Console(file=None, force_terminal=False, width=120)
    columns = [c for c in StepProgress(10, console, max_time=60.0).progress.columns]
    remaining = [c for c in columns if isinstance(c, RemainingColumn)]
    assert len(remaining) == 1 and remaining[0].deadline is not None
    columns = StepProgress(10, console).progress.columns
    assert [c.deadline for c in columns if isinstance(c, RemainingColumn)] == [None]
