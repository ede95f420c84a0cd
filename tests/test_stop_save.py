"""A run stopped (Ctrl-C, SIGTERM) on a train.save_every step saves its state once: the final save
that follows the loop, which holds what arrived meanwhile, not a periodic save as well."""

from __future__ import annotations

import os
import signal

from tiny_args import TINY

from streamrl.cli import main
from streamrl.loop import job


def test_a_stop_on_a_save_every_step_saves_the_state_once(tmp_path, monkeypatch) -> None:
    real_save, saved = job.save_state, []

    def save_state(run_dir, snapshot, *args, **kw):
        saved.append(snapshot.step)
        return real_save(run_dir, snapshot, *args, **kw)

    def periodic_eval(*args, **kw):  # step 2's evaluation: a real SIGINT, taken by the run's handler
        os.kill(os.getpid(), signal.SIGINT)
        return {}

    monkeypatch.setattr(job, "save_state", save_state)
    monkeypatch.setattr(job, "periodic_eval", periodic_eval)
    run = tmp_path / "run"
    args = ["max_steps=6", "train.save_every=2", "eval.every=2", "eval.after=false", f"run_dir={run}"]
    assert main(["train", *TINY, *args]) == 0
    assert saved == [2]
    assert sorted(p.name for p in (run / "state").iterdir()) == ["step-000002"]
