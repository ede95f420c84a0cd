"""The task's verdict beside your reward functions: when the reward is your functions' alone, a verifier
that raises or a judge that cannot be reached costs the sample's accuracy (correct=False, the reason
in reward_info["verdict_error"] and counted in the step's metrics), not the reward your functions gave;
when the reward holds the task's own (fn: task), its failure fails the score as before."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from user_rewards import _problem, _traj  # tests/ is on sys.path

from streamrl.config import load_config
from streamrl.loop.step_metrics import step_record
from streamrl.rollout.score import Scoring
from streamrl.types import Group, Trajectory


def _scored_by(overrides: list[str], verifier_raises: bool, message: str = "verifier bug") -> Trajectory:
    """One response "so 7" (2 tokens) to 3+4, scored inline; the verifier raises `message` if asked to."""
    from streamrl.data.sources import task_from_rows

    task = task_from_rows([{"prompt": "What is 3+4?", "answer": "7"}], extract="last_number")
    if verifier_raises:

        def score(problem: object, text: str) -> None:
            raise RuntimeError(message)

        task.score = score  # type: ignore[method-assign]
    cfg = load_config(None, ["reward.extract=last_number", "reward.service=inline", *overrides])
    scoring = Scoring(cfg, task)
    t = _traj("so 7", [5, 6])
    try:
        scoring.score([(_problem(), t)])
    finally:
        scoring.close()
    return t


def test_a_verifier_that_raises_costs_the_accuracy_not_your_functions_reward(user_file: Path) -> None:
    t = _scored_by(["reward.fn=my_rewards.py:brevity"], verifier_raises=True)
    assert (t.reward, t.correct, t.reward_info["reward_error"]) == (1 / 3, False, None)  # 1 / (1 + 2)
    assert t.reward_info["verdict_error"] == "RuntimeError"
    record = step_record(1, [Group(_problem(), [t])], {}, 0)
    assert (record["verdict_errors"], record["verdict_error_reasons"]) == (1, {"RuntimeError": 1})
    pid = _problem().id  # the message reaches the step record, naming the problem
    assert record["verdict_error_examples"] == {"RuntimeError": f"RuntimeError: verifier bug (problem {pid})"}
    assert (record["reward_errors"], record["accuracy"], record["reward_mean"]) == (0, 0.0, 1 / 3)


def test_a_verifiers_long_message_is_cut_as_every_kept_message_is(user_file: Path) -> None:
    from streamrl.observe.error_examples import MESSAGE_CHARS

    t = _scored_by(["reward.fn=my_rewards.py:brevity"], verifier_raises=True, message="x" * 2000)
    kept = MESSAGE_CHARS - len("RuntimeError: ... (problem p1)")  # only the exception's text is cut
    message = f"RuntimeError: {'x' * kept}... (problem p1)"
    assert len(message) == MESSAGE_CHARS and t.reward_info["verdict_error_detail"] == message
    record = step_record(1, [Group(_problem(), [t])], {}, 0)
    assert record["verdict_error_examples"] == {"RuntimeError": message}


def test_a_verifier_that_works_keeps_its_verdict_and_no_error(user_file: Path) -> None:
    t = _scored_by(["reward.fn=my_rewards.py:brevity"], verifier_raises=False)
    assert (t.reward, t.correct, t.reward_info["reward_error"]) == (1 / 3, True, None)
    assert "verdict_error" not in t.reward_info
    assert "verdict_errors" not in step_record(1, [Group(_problem(), [t])], {}, 0)


def test_a_verifier_that_raises_fails_a_reward_made_with_it(user_file: Path) -> None:
    fns = "reward.fns=[{fn: my_rewards.py:brevity}, {fn: task, weight: 0.5}]"
    t = _scored_by([fns], verifier_raises=True)
    assert (t.reward, t.correct, t.reward_info["reward_error"]) == (0.0, False, "RuntimeError")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("fns", "reward", "error"),
    [
        ("reward.fn=my_rewards.py:brevity", 1 / 3, None),
        ("reward.fns=[{fn: my_rewards.py:brevity}, {fn: task}]", 0.0, "JudgeError/connection error"),
    ],
    ids=["your-functions-alone", "with-the-judges-score"],
)
def test_an_unreachable_judge_costs_the_accuracy_unless_its_score_is_in_the_reward(
    user_file: Path, fns: str, reward: float, error: str | None
) -> None:
    judge = [f"reward.judge_url=http://127.0.0.1:{_closed_port()}/v1", "reward.judge_model=m"]
    t = _scored_by([fns, "reward.scorer=judge", *judge], verifier_raises=False)
    assert (t.reward, t.correct, t.reward_info["reward_error"]) == (reward, False, error)
    if error is None:
        assert t.reward_info["verdict_error"] == "JudgeError/connection error"
