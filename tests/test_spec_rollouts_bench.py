"""benchmarks/spec_rollouts.py: the totals it reads from the step records after the first epoch."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import spec_rollouts  # noqa: E402


def _row(step: int, tokens: int, busy: float, thread_s: float, t: float) -> dict:
    return {
        "cores_worker_held_s": thread_s / 2 + step,
        "step": step,
        "engine_tokens": tokens,
        "engine_busy_time": busy,
        "cores_worker_thread_s": thread_s,
        "time": t,
        "train_time": 0.5 * step,
        "tokens_generated": 0,
        "spec_verified_tokens": 10,
        "spec_acceptance_rate": 0.5,
        "spec_draft_share": 0.25,
    }


def test_the_window_counts_the_steps_after_the_first_epoch_and_the_engines_cores():
    # steps 1-2 are the first epoch; the window is steps 3-4, measured from step 2's cumulative figures
    rows = [_row(1, 100, 1.0, 1.0, 5.0), _row(2, 300, 3.0, 4.0, 9.0), _row(3, 500, 5.0, 7.0, 12.0)]
    rows.append(_row(4, 900, 7.0, 10.0, 17.0))
    w = spec_rollouts.window({"rows": rows}, first_epoch_steps=2, per_step=8)
    assert w == {
        "tokens": 600,
        "generate_s": 4.0,
        "wall_s": 8.0,
        "engine_thread_s": 6.0,
        "engine_held_s": 5.0,
        "steps": 2,
        "train_s": 3.5,
        "verified": 20,
        "accepted": 10.0,
        "drafted": 4.0,
    }
    args = argparse.Namespace(problems=8, prompts=4, samples=2)
    s = spec_rollouts.summarise("spec", [{"rows": rows, "seed": 0, "correct": [True, False]}], args)
    assert (s["rollout_tokens_per_s"], s["engine_cores"], s["samples_per_s"]) == (150.0, 1.2, 2.0)
    assert (s["acceptance_rate"], s["accepted_per_draft"], s["trainer_s_per_step"]) == (0.5, 2.5, 1.75)


def test_per_seed_ratios_hold_the_trainers_seconds_per_step_the_machines_speed_between_the_runs():
    def run(arm: str, tokens_scale: int, train_scale: float) -> dict:
        rows = [_row(s, tok * tokens_scale, busy, 0.0, t) for s, tok, busy, t in RUN]
        for r in rows:
            r["train_time"] = train_scale * r["step"]
        return {"arm": arm, "seed": 0, "rows": rows, "correct": []}

    args = argparse.Namespace(problems=8, prompts=4, samples=2)
    # plain: 600 tokens in 4 busy s, 1.75 trainer s/step; spec: twice the tokens, half the trainer's time
    ratios = spec_rollouts.per_seed_ratios([run("plain", 1, 0.5)], [run("spec", 2, 0.25)], args)
    assert ratios == [(0, 2.0, 1.0, 0.5)]
    plain, spec = run("plain", 1, 0.5), run("spec", 2, 0.25)
    for p_run, s_run in ((run("plain", 1, 0.0), spec), (plain, run("spec", 2, 0.0))):  # no train_time
        assert math.isnan(spec_rollouts.per_seed_ratios([p_run], [s_run], args)[0][3])


RUN = [(1, 100, 1.0, 5.0), (2, 300, 3.0, 9.0), (3, 500, 5.0, 12.0), (4, 900, 7.0, 17.0)]
