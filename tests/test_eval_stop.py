"""Ctrl-C or SIGTERM during a run's held-out evaluation: the evaluation stops at the engine's next batch,
nothing measured so far is claimed, and a resume measures what was stopped (the base model, before any
step; the trained model, after the last)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from tiny_args import TINY

from streamrl.cli import main
from streamrl.engine.base import GenRequest
from streamrl.engine.hf import HFEngine
from streamrl.eval.heldout import EvalStopped, _generate
from streamrl.loop import job


def _requests(tok) -> list[GenRequest]:
    texts = ["a much longer prompt, 12345", "hi", "1+1", "three words here", "x", "what is 6*7?", "ok then"]
    return [GenRequest(tok(t).input_ids, max_new_tokens=6, temperature=0.0) for t in texts]


def test_batches_asked_to_stop_are_the_engines_own(tiny) -> None:
    model, tok = tiny
    whole = HFEngine(model, tok, max_batch=3).generate(_requests(tok))
    asked: list[int] = []
    engine = HFEngine(model, tok, max_batch=3)
    calls: list[list[int]] = []
    real = engine.generate
    engine.generate = lambda reqs: calls.append([len(r.prompt_ids) for r in reqs]) or real(reqs)  # type: ignore[method-assign]
    reqs = _requests(tok)
    parts = _generate(engine, reqs, lambda: asked.append(1) and False)
    by_length = sorted(len(r.prompt_ids) for r in reqs)
    assert calls == [by_length[:3], by_length[3:6], by_length[6:]] and len(asked) == 3  # max_batch each
    # the same batches as one call forms (prompts by length), so the same tokens and log-probs
    assert [(r.token_ids, r.logprobs) for r in parts] == [(r.token_ids, r.logprobs) for r in whole]
    answers = iter([False, True])
    with pytest.raises(EvalStopped, match="stopped after 3 of 7 problems"):
        _generate(engine, _requests(tok), lambda: next(answers))


def _stop_at_evaluation(monkeypatch, which: int) -> None:
    """A real SIGINT, taken by the run's own handler, as the run's `which`-th evaluation starts."""
    real, seen = job.evaluate, []

    def evaluate(*args, **kw):
        seen.append(1)
        if len(seen) == which:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kw)

    monkeypatch.setattr(job, "evaluate", evaluate)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_stop_during_the_final_evaluation_is_taken_and_resume_evaluates(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    with monkeypatch.context() as mp:
        _stop_at_evaluation(mp, 1)  # eval.before=false: the first evaluation is the final one
        assert main(["train", *TINY, "max_steps=2", f"run_dir={run}"]) == 0
    assert "stopped by SIGINT during the final evaluation; step 2 is saved" in capsys.readouterr().err
    summary = _json(run / "summary.json")
    assert summary["interrupted"] is True and summary["steps"] == 2
    assert _json(run / "eval.json")["final"] is None
    assert main(["train", f"resume={run}"]) == 0
    final = _json(run / "eval.json")["final"]
    assert final is not None and final["n"] == 4
    assert _json(run / "summary.json")["interrupted"] is False and _steps(run) == [1, 2]  # no step again


def test_a_stop_during_the_base_evaluation_saves_step_0_and_resume_measures_the_base(
    tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    args = [*TINY, "max_steps=2", "eval.before=true", f"run_dir={run}"]
    with monkeypatch.context() as mp:
        _stop_at_evaluation(mp, 1)
        assert main(["train", *args]) == 0
    assert "the base model's evaluation was stopped by SIGINT" in capsys.readouterr().err
    assert _json(run / "summary.json")["steps"] == 0
    assert _json(run / "eval.json")["base"] is None
    assert main(["train", f"resume={run}"]) == 0
    evals = _json(run / "eval.json")
    assert evals["base"]["n"] == evals["final"]["n"] == 4 and "difference" in evals
    assert _steps(run) == [1, 2]
