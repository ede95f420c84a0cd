"""Ctrl-C or SIGTERM during a run's held-out evaluation: the evaluation stops at the engine's next
decode step, nothing measured so far is claimed, and a resume measures what was stopped (the base
model, before any step; the trained model, after the last)."""

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
from streamrl.eval.heldout import EvalStopped, evaluate
from streamrl.loop import job


def _requests(tok) -> list[GenRequest]:
    texts = ["a much longer prompt, 12345", "hi", "1+1", "three words here", "x", "what is 6*7?", "ok then"]
    return [GenRequest(tok(t).input_ids, max_new_tokens=6, temperature=0.0) for t in texts]


def _asks_until(n: int, asked: list[int]):
    """A stop flag that says True from its n-th question on, counting the questions in `asked`."""
    return lambda: asked.append(1) or len(asked) >= n


def test_the_engine_asks_stop_before_each_decode_step_and_aborts_what_is_unfinished(tiny) -> None:
    model, tok = tiny
    whole = HFEngine(model, tok, max_batch=3).generate(_requests(tok))
    engine = HFEngine(model, tok, max_batch=3)
    asked: list[int] = []
    never = engine.generate(_requests(tok), stop=_asks_until(10**9, asked))
    assert [(r.token_ids, r.logprobs) for r in never] == [(r.token_ids, r.logprobs) for r in whole]
    # the batches as the engine forms them (prompts by length, max_batch each): one question per step,
    # a step per token of a batch's longest response
    order = sorted(range(7), key=lambda i: len(_requests(tok)[i].prompt_ids))
    steps = [max(len(whole[i].token_ids) for i in order[k : k + 3]) for k in (0, 3, 6)]
    assert len(asked) == sum(steps)
    asked.clear()  # stop at the second batch's first step: the first batch is kept, the rest aborted
    parts = engine.generate(_requests(tok), stop=_asks_until(steps[0] + 1, asked))
    first = set(order[:3])
    assert [r.finish_reason == "abort" for r in parts] == [i not in first for i in range(7)]
    assert all(parts[i].token_ids == whole[i].token_ids for i in first)
    assert all(parts[i].token_ids == [] for i in range(7) if i not in first)
    assert not engine._pending and not engine._done  # nothing left behind for the next call
    again = engine.generate(_requests(tok))
    assert [r.token_ids for r in again] == [r.token_ids for r in whole]


def test_an_engine_whose_generate_takes_no_stop_serves_callers_that_give_none() -> None:
    """vLLM's generate takes the requests only: the one call path passes `stop` only when there is one."""
    from streamrl.engine.base import GenResult, generate

    class NoStop:
        def generate(self, requests: list[GenRequest]) -> list[GenResult]:
            return [GenResult(request=r, finish_reason="length") for r in requests]

    req = GenRequest([1, 2], max_new_tokens=1)
    assert [r.request for r in generate(NoStop(), [req])] == [req]
    with pytest.raises(TypeError):  # a stop it cannot ask is an error, not a stop silently dropped
        generate(NoStop(), [req], stop=lambda: False)


def test_an_evaluation_told_to_stop_raises_and_claims_nothing(tiny) -> None:
    from streamrl.data.task import default_task_args
    from streamrl.tasks import make_task
    from streamrl.types import Problem

    model, tok = tiny
    task = make_task("rg:chain_sum", default_task_args("rg:chain_sum"), "", "", "answer_is")
    problems = [
        Problem(id=str(i), messages=[{"role": "user", "content": f"{i}+1"}], answer=str(i + 1))
        for i in range(5)
    ]
    engine = HFEngine(model, tok, max_batch=2)
    asked: list[int] = []
    with pytest.raises(EvalStopped, match="stopped with 0 of 5 problems answered"):
        evaluate(engine, tok, task, problems, 4, stop=_asks_until(1, asked))
    assert len(asked) == 1
    assert len(evaluate(engine, tok, task, problems, 4, stop=lambda: False).correct) == 5


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


def test_a_sampled_evaluation_told_to_stop_raises_and_claims_nothing(tiny) -> None:
    from streamrl.data.task import default_task_args
    from streamrl.eval.sampled import evaluate_sampled
    from streamrl.tasks import make_task
    from streamrl.types import Problem

    model, tok = tiny
    task = make_task("rg:chain_sum", default_task_args("rg:chain_sum"), "", "", "answer_is")
    problems = [
        Problem(id=str(i), messages=[{"role": "user", "content": f"{i}+1"}], answer="1") for i in range(3)
    ]
    engine = HFEngine(model, tok, max_batch=2)
    asked: list[int] = []
    with pytest.raises(EvalStopped, match="stopped with 0 of 9 responses sampled"):  # 2 samples + greedy
        evaluate_sampled(engine, tok, task, problems, 2, [1, 2], 1.0, 1.0, 4, stop=_asks_until(1, asked))
    assert len(asked) == 1


def test_a_stop_during_a_periodic_evaluation_ends_it_and_saves_the_step(tmp_path, monkeypatch, capsys):
    """SIGINT as step 2's evaluation (eval.every=2) starts: its first decode step asks the stop and the
    evaluation ends there; step 2 is logged without held-out metrics and its state saved."""
    import streamrl.loop.heldout as heldout

    real, asked = heldout.evaluate, []

    def evaluate(*args, **kw):
        os.kill(os.getpid(), signal.SIGINT)  # taken by the run's own handler
        stop = kw.get("stop") or (lambda: False)
        kw["stop"] = lambda: asked.append(1) or stop()
        return real(*args, **kw)

    monkeypatch.setattr(heldout, "evaluate", evaluate)
    run = tmp_path / "run"
    assert main(["train", *TINY, "max_steps=4", "eval.every=2", "eval.after=false", f"run_dir={run}"]) == 0
    assert "stopped by SIGINT at step 2: state saved" in capsys.readouterr().err
    assert len(asked) == 1  # the first decode step's question ended it
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2] and "heldout_accuracy" not in lines[1]
    assert _json(run / "summary.json")["interrupted"] is True
    assert sorted(p.name for p in (run / "state").iterdir()) == ["step-000002"]
