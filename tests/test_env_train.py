"""`streamrl train task=env:...` on tiny-random, in both runtime modes: multi-turn episodes are trained on."""

import json

import pytest

from streamrl.cli import main

TINY_ENV = [
    "model=tiny-random",
    "eval.size=2",
    "eval.before=false",
    "rollout.prompts_per_step=2",
    "rollout.samples_per_prompt=2",
    "rollout.dynamic_sampling=false",  # random output never answers: every group has reward 0
    "env.max_turns=3",
    "env.max_tokens_per_turn=6",
    "env.max_total_tokens=160",
    "checkpoint.save=false",
]


@pytest.mark.parametrize("mode", ["colocated", "async"])
def test_env_search_trains_in_both_modes(tmp_path, mode):
    run = tmp_path / mode
    eta = 0 if mode == "colocated" else 1
    args = [*TINY_ENV, "task=env:search", f"runtime.mode={mode}", f"max_staleness={eta}", "max_steps=2"]
    assert main(["train", *args, f"run_dir={run}"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]
    for r in rows:
        # search's protocol reminder keeps unanswered episodes going: model turn (6) + reminder turn
        # (118 byte tokens with the closing <|im_end|>) + model turn (6) = 130; a second reminder
        # would not fit in 160 tokens, so every episode ends with "length" after 2 model turns
        if mode == "colocated":  # seeded: no end-of-turn token is sampled
            assert r["response_length"] == 130 and sum(r["staleness_hist"].values()) == 4 * 12
        else:  # another seed: a turn may end early on its end-of-turn token
            assert 119 <= r["response_length"] <= 130 and 8 <= sum(r["staleness_hist"].values()) <= 48
        assert r["truncation_rate"] == 1.0 and r["staleness_max"] <= eta and r["tokens_trained"] > 0
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 4
    if mode == "async":  # engine_tokens counts sampled tokens, not the reminders spliced in between turns:
        # at least the trained episodes' model tokens, at most 2 turns x 6 per returned episode
        sampled = sum(sum(r["staleness_hist"].values()) for r in rows)
        assert sampled <= rows[-1]["engine_tokens"] <= 2 * 6 * 2 * acc["generated"]
    ev = json.loads((run / "eval.json").read_text())
    assert ev["final"]["n"] == 2 and ev["base"] is None


def test_env_python_tool_trains_colocated(tmp_path):
    run = tmp_path / "py"
    args = [*TINY_ENV, "task=env:python_tool", "runtime.mode=colocated", "max_staleness=0", "max_steps=1"]
    assert main(["train", *args, "reward.extract=last_number", f"run_dir={run}"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["response_length"] <= 160
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 2


def test_env_task_with_eval_size_zero_skips_eval(tmp_path):
    run = tmp_path / "noeval"
    args = [*TINY_ENV, "task=env:search", "runtime.mode=colocated", "max_staleness=0", "max_steps=1"]
    assert main(["train", *args, "eval.size=0", f"run_dir={run}"]) == 0
    ev = json.loads((run / "eval.json").read_text())
    assert ev["base"] is None and ev["final"] is None
