"""When a run stops: after max_steps, on a stop request (Ctrl-C, SIGTERM) or after max_time seconds."""

from __future__ import annotations

import time

from streamrl.loop.signals import StopFlag


class RunBudget:
    def __init__(self, max_steps: int, max_time: float, stop: StopFlag) -> None:
        self.max_steps, self.max_time, self.stop = max_steps, max_time, stop
        self.started = time.perf_counter()
        self._over_time: tuple[int, bool] | None = None  # max_time's verdict, once taken after a step

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def more(self, step: int) -> bool:
        """True while step `step` + 1 may start. max_time's verdict after a step is taken once: asked
        when the step is done (StepRecord.last), it holds after the step's periodic save too, so a
        step the time limit ends is saved once, by the final save."""
        if self._over_time is None or self._over_time[0] != step:
            self._over_time = (step, self.max_time > 0 and self.elapsed >= self.max_time)
        return step < self.max_steps and not self.stop and not self._over_time[1]
