"""A reward function that fails on real responses: the first message of each kind of failure reaches
the console once (not once per sample) and every step's record (`reward_error_examples`), which stays
strict JSON."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from tiny_args import TINY  # tests/ is on sys.path

from streamrl.cli import main

RAISE_LATER = """
def raise_later(prompts, completions, completion_ids, **kw):
    if len(completion_ids[0]) >= 8:  # the start-up check's short sample passes
        raise KeyError("answer_x")
    return [0.0]
"""


def _strict(line: str) -> dict:
    def refuse(token: str) -> None:
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(line, parse_constant=refuse)


@pytest.mark.parametrize("mode", ["async", "colocated"])
def test_a_reward_that_raises_is_shown_once_with_its_message(
    tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture, mode: str
):
    """Once on the console in either mode: colocated, the reward service runs in the trainer's process,
    whose own first-failure warning would be a second line (pytest takes log records off the console:
    they are counted from caplog)."""
    (tmp_path / "rw.py").write_text(RAISE_LATER)
    run = tmp_path / "run"
    args = [*TINY, f"reward.fn={tmp_path / 'rw.py'}:raise_later", "max_steps=1", "eval.after=false"]
    if mode == "colocated":
        args += ["runtime.mode=colocated", "max_staleness=0"]
    assert main(["train", *args, f"run_dir={run}"]) == 0
    captured = capsys.readouterr()
    out = " ".join((captured.out + captured.err).split())  # the console wraps long lines
    [row] = [_strict(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["reward_error_reasons"] == {"KeyError": 8}
    [message] = row["reward_error_examples"].values()
    assert re.fullmatch(r"KeyError: 'answer_x' \(reward function raise_later, problem \S+\)", message)
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and "answer_x" in r.getMessage()]
    assert out.count("KeyError: 'answer_x'") + len(warned) == 1  # 8 failures, one line
    assert "reward error (scored 0) at step 1, the first KeyError: " + message in out
    assert "in metrics.jsonl reward_error_examples" in out  # the warning says where the message is
    if mode == "async":  # the rollout worker's own log is kept in the run directory, the service's line in it
        assert "(KeyError: 'answer_x')" in (run / "rollout-worker0.log").read_text()


def test_each_kind_is_shown_once_in_a_run_and_not_again_after_a_resume():
    from streamrl.observe.error_examples import ErrorExamples

    rows = [
        {"step": 1, "reward_error_examples": {"KeyError": "KeyError: 'a'"}},
        {"step": 2, "reward_error_examples": {"KeyError": "KeyError: 'b'", "timeout": "timeout: slow"}},
        {"step": 3, "episode_error_examples": {"KeyError": "KeyError: 'c'"}, "reward_error_examples": {}},
    ]
    seen = ErrorExamples()
    assert [seen.update(r) for r in rows] == [
        ["reward error (scored 0) at step 1, the first KeyError: KeyError: 'a'"],
        ["reward error (scored 0) at step 2, the first timeout: timeout: slow"],
        ["agent episode error at step 3, the first KeyError: KeyError: 'c'"],
    ]
    resumed = ErrorExamples(history=rows[:2])
    assert resumed.update(rows[1]) == [] and len(resumed.update(rows[2])) == 1


def test_a_worker_logs_tail_is_the_ended_process_own(tmp_path: Path):
    from streamrl.placement.worker_log import tail as _tail

    log = tmp_path / "rollout-worker0.log"
    log.write_text("--- first process\nTraceback: old failure\n--- second process\n")
    start = log.stat().st_size
    assert _tail(log, start) == "(nothing)"  # the restarted process wrote nothing yet
    with log.open("a") as f:
        f.write("KeyError: 'answer_x'\n")
    assert _tail(log, start) == repr("KeyError: 'answer_x'")
    assert _tail(log, 0, n=10) == repr("'answer_x'")
