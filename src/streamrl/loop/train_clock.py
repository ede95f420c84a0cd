"""The training clock: seconds of the RL loop spent training, `train_elapsed` in metrics.jsonl.

Wall time since the loop started minus the time spent with the clock paused: periodic held-out
evaluation (eval.every), periodic state saves (train.save_every) and checkpoint exports
(checkpoint.every), work that a run without them would not do. The asynchronous loop starts once its
rollout workers are ready (local ones; Ray actors are not waited for): their imports and model load
are set-up, as the trainer's model load is. A time-to-accuracy curve plots held-out accuracy against
it (benchmarks/vs_trl.py --eval-every). In the asynchronous loop only the trainer pauses: the rollout
workers keep generating meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class TrainClock:
    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now
        self.started = now()
        self.paused = 0.0  # seconds spent inside pause()

    @contextmanager
    def pause(self) -> Iterator[None]:
        """Time spent in the with-block does not count as training."""
        t0 = self.now()
        try:
            yield
        finally:
            self.paused += self.now() - t0

    @property
    def elapsed(self) -> float:
        """Training seconds since the clock started."""
        return self.now() - self.started - self.paused
