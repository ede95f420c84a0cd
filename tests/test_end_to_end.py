"""`streamrl train` on tiny-random through the CLI: the run directory is complete and usable."""

import json

import pytest
import torch
import yaml

from streamrl.cli import main

REQUIRED = {"step", "time", "reward_mean", "accuracy", "tokens_generated", "tokens_trained", "policy_version"}


def test_train_two_steps_writes_run_dir(tmp_path):
    from transformers import AutoModelForCausalLM

    from streamrl.models import resolve_model_dir

    run = tmp_path / "run"
    code = main(
        [
            "train",
            "model=tiny-random",
            "max_steps=2",
            f"run_dir={run}",
            "seed=0",
            "eval.size=8",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=4",
            "rollout.max_new_tokens=8",
            "eval.max_new_tokens=8",
            "train.lr=1e-2",
            # any digit counts as formatted, so random output has reward variance and a real gradient
            "reward.extract=last_number",
        ]
    )
    assert code == 0
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["model"] == "tiny-random" and cfg["max_steps"] == 2
    assert cfg["task_config"]["args"]["max_digits"] == 2  # the resolved task args are recorded
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    assert [r["policy_version"] for r in lines] == [1, 2]
    for r in lines:
        assert REQUIRED <= r.keys()
        assert r["tokens_generated"] > 0 and r["tokens_trained"] > r["tokens_generated"]
        assert r["staleness_max"] == 0  # synchronous: every token from the current policy
    ev = json.loads((run / "eval.json").read_text())
    assert ev["base"]["n"] == ev["final"]["n"] == 8
    assert len(ev["difference"]["ci95"]) == 2
    assert list((run / "tensorboard").iterdir())
    trained = AutoModelForCausalLM.from_pretrained(run / "checkpoint")
    initial = AutoModelForCausalLM.from_pretrained(resolve_model_dir("tiny-random", seed=0))
    diffs = [not torch.equal(a, b) for a, b in zip(trained.parameters(), initial.parameters())]
    assert any(diffs), "two RL steps with non-zero advantages must change the weights"


def test_bad_task_fails_before_training(tmp_path, capsys):
    code = main(["train", "model=tiny-random", "task=rg:nope", f"run_dir={tmp_path / 'r'}"])
    assert code == 2
    assert "unknown reasoning-gym task 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_resolves_and_loads():
    from streamrl.models import load_model, load_tokenizer, resolve_model_dir

    d = resolve_model_dir("smollm2-135m-instruct")
    tok, model = load_tokenizer(d), load_model(d)
    assert tok.eos_token == "<|im_end|>" and model.config.hidden_size == 576
