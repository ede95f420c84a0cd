"""A real Ctrl-C delivered to the test process right after a given step is logged (tests/ is on sys.path)."""

import os
import signal

from streamrl.observe.live import RunObserver


def stop_after(monkeypatch, step: int) -> None:
    """The run's own SIGINT handler takes it: the run stops after `step` with its state saved."""
    original = RunObserver.on_step

    def on_step(self, record):
        original(self, record)
        if record["step"] == step:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(RunObserver, "on_step", on_step)
