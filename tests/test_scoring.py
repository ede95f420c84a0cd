"""Rollout-side scoring: a failing or hanging scorer costs one reward, counted in the step metrics."""

import logging
import threading

import pytest
from trajectories import make_traj

from streamrl.config import load_config
from streamrl.loop.step_metrics import step_record
from streamrl.rollout import score as scoring_mod
from streamrl.rollout.score import Scoring
from streamrl.types import Group, Problem


class FlakyScorer:
    """'ok' -> 1.0 correct; 'boom' raises; 'hang' is held until the test sets `release` (at most 30 s),
    then sets `hang_done`. Thread mode: the events are shared with the test."""

    name = "flaky"
    release = threading.Event()
    hang_done = threading.Event()

    def __init__(self, cfg_dict, task=None):
        pass

    def __call__(self, problem, text, ids=()):
        if text == "boom":
            raise RuntimeError("scorer bug")
        if text == "hang":
            FlakyScorer.release.wait(30)
            FlakyScorer.hang_done.set()
        return 1.0, {"correct": True, "formatted": True}


@pytest.fixture()
def scoring(monkeypatch):
    monkeypatch.setattr(scoring_mod, "TaskScorer", FlakyScorer)
    keys = [
        "reward.timeout_s=0.5",
        "reward.overlong_buffer=4",
        "rollout.max_new_tokens=6",
        "reward.length_penalty=0.01",
    ]
    s = Scoring(load_config(None, keys))
    yield s
    s.close()


@pytest.mark.parametrize(("given", "first"), [(None, logging.WARNING), (logging.DEBUG, logging.DEBUG)])
def test_the_first_failure_of_a_kind_is_logged_at_the_level_scoring_is_given(
    monkeypatch, caplog, given, first
):
    """The colocated trainer gives DEBUG: its step records show each kind's first message already, so a
    warning of its own would print it twice. Later failures of the kind are at DEBUG either way."""
    monkeypatch.setattr(scoring_mod, "TaskScorer", FlakyScorer)
    cfg = load_config(None, ["reward.service=inline"])
    s = Scoring(cfg) if given is None else Scoring(cfg, first_failure_level=given)
    caplog.set_level(logging.DEBUG, logger="streamrl.rewards.service")
    trajs = [make_traj(i, [1], [2]) for i in range(2)]
    for t in trajs:
        t.text = "boom"
    s.score([(Problem("p", [], "1"), t) for t in trajs])
    s.close()
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if "scorer bug" in r.getMessage()]
    assert logged == [
        (level, "reward flaky -> 0.0 (RuntimeError: scorer bug)") for level in (first, logging.DEBUG)
    ]


def test_failures_cost_one_reward_each_and_are_counted(scoring):
    problem = Problem("p", [], "1")
    trajs = [make_traj(i, [1], [2] * n) for i, n in enumerate([2, 2, 2, 5])]
    for t, text in zip(trajs, ["ok", "boom", "hang", "ok"]):
        t.text = text
    FlakyScorer.release.clear()
    FlakyScorer.hang_done.clear()
    try:
        scoring.score([(problem, t) for t in trajs])
        hang_finished_first = FlakyScorer.hang_done.is_set()
    finally:
        FlakyScorer.release.set()
    assert not hang_finished_first, "score() waited for the hung scorer instead of its 0.5 s timeout"
    # the last one is 5 tokens of 6 with a 4-token overlong buffer: penalty -(5 - 2) / 4; and 0.01/token
    assert [t.reward for t in trajs] == pytest.approx([0.98, -0.02, -0.02, 0.20])
    assert [t.correct for t in trajs] == [True, False, False, True]
    assert [t.reward_info["reward_error"] for t in trajs] == [None, "RuntimeError", "timeout", None]
    rec = step_record(1, [Group(problem, trajs)], {}, 0)
    assert (rec["reward_errors"], rec["reward_timeouts"]) == (2, 1)
    assert rec["reward_error_reasons"] == {"RuntimeError": 1, "timeout": 1}
    assert rec["reward_error_examples"] == {  # each reason's first message, naming the problem
        "RuntimeError": "RuntimeError: scorer bug (problem p1)",
        "timeout": "timeout: no result within 0.5s; worker replaced (problem p2)",
    }
    assert rec["reward_cache_hit_rate"] == 0.25  # the second "ok" for the same problem came from the cache
    # response lengths 2, 2, 2, 5: mean 2.75, population std sqrt(37 / 4 - 2.75^2)
    assert rec["response_length"] == 2.75 and rec["response_length_max"] == 5
    assert rec["response_length_std"] == pytest.approx((37 / 4 - 2.75**2) ** 0.5)


@pytest.mark.parametrize(
    ("rewards", "group_baseline", "share"),
    [
        ([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]], True, 2 / 3),  # groups of equal rewards: zero advantage
        ([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]], False, 0.0),  # against the batch's mean they have one
        ([[1.0, 1.0], [1.0, 1.0]], False, 1.0),  # a batch of equal rewards: nothing to learn from
    ],
)
def test_zero_advantage_groups_follow_the_estimators_baseline(rewards, group_baseline, share):
    problem = Problem("p", [], "7", {"question": "q"})
    groups = [Group(problem, [make_traj(i, [1], [2], r) for i, r in enumerate(g)]) for g in rewards]
    rec = step_record(1, groups, {}, 0, group_baseline=group_baseline)
    assert rec["zero_adv_group_frac"] == pytest.approx(share)


@pytest.mark.parametrize("mode", ["colocated", "async"])
def test_code_task_trains_end_to_end_with_sandboxed_scoring(tmp_path, mode):
    import json

    from streamrl.cli import main

    run = tmp_path / mode
    args = [
        "train",
        "task=code",
        "model=tiny-random",
        "eval.size=2",
        "eval.before=false",
        "eval.after=false",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=8",
        "checkpoint.save=false",
        "rollout.dynamic_sampling=false",
        f"runtime.mode={mode}",
        "max_staleness=0",
        "max_steps=2",
        f"run_dir={run}",
    ]
    assert main(args) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]
    assert all(r["reward_errors"] == 0 and r["reward_latency_mean_s"] >= 0 for r in rows)
    assert json.loads((run / "accounting.json").read_text())["lost"] == 0


def test_a_judges_timeouts_count_as_timeouts_and_its_reasons_apart():
    from streamrl.rewards.judge import JudgeError
    from streamrl.rewards.workers import call_scorer

    def judge(text):
        raise JudgeError("http 500" if text == "a" else "timeout", "the endpoint")

    assert call_scorer(judge, ("a",))[:2] == ("err", "JudgeError/http 500")
    assert call_scorer(judge, ("b",))[:2] == ("err", "JudgeError/timeout")
    assert call_scorer(lambda text: 1 / 0, ("c",))[:2] == ("err", "ZeroDivisionError")
    problem = Problem("p", [], "1")
    trajs = [make_traj(i, [1], [2]) for i in range(3)]
    for t, err in zip(trajs, ["JudgeError/timeout", "JudgeError/http 500", "step_budget"]):
        t.reward_info = {"reward_error": err, "reward_latency_s": 0.1, "reward_cached": False}
    rec = step_record(1, [Group(problem, trajs)], {}, 0)
    assert (rec["reward_errors"], rec["reward_timeouts"], rec["reward_step_budget_expired"]) == (3, 2, 1)
