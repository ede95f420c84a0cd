"""An agent's final text is scored by the reward service, as a plain response is: bounded by
reward.timeout_s, off the loop that decodes, and counted in the step's scoring metrics."""

import json

import pytest
from test_agent_task import TINY

from streamrl.cli import main


@pytest.mark.parametrize("mode", ["colocated", "async"])
def test_an_agent_answer_whose_scoring_hangs_costs_its_episode_not_the_run(tmp_path, mode):
    """Every agent answers with a program that never ends; the code task's sandbox would run each test
    to its own limit (seconds), the reward service gives up at reward.timeout_s: each episode scores 0
    with reason "timeout", counted once per episode, and the run trains on."""
    run = tmp_path / mode
    args = [a for a in TINY if not a.startswith(("runtime.mode", "max_staleness"))]
    args += [f"runtime.mode={mode}", f"max_staleness={int(mode == 'async')}", "reward.timeout_s=0.2"]
    task = "task=agent:agents_for_tests:call_then_answer_an_endless_program"
    assert main(["train", task, "task_config.args={base: code}", *args, f"run_dir={run}"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]
    for r in rows:
        # the trained groups' 4 episodes (async: the episodes counted are those returned, ahead too)
        assert r["episodes"] >= 4 and r["episode_errors"] == 0 and r["reward_mean"] == 0
        assert (r["rewards_scored"], r["reward_error_reasons"]) == (4, {"timeout": 4})
        assert r["tokens_trained"] > 0
