"""Training through task=hf:NAME: problems come from the dataset's train split, evaluation from its test."""

import json

from hf_cache import gsm8k_table, hub_snapshot
from tiny_args import TINY

from streamrl.cli import main


def test_train_through_a_hub_name_trains_on_its_train_split_and_evaluates_its_test_split(
    offline_hub, tmp_path
):
    hub, _ = offline_hub
    hub_snapshot(
        hub, "streamrl-test/train-me", {"train": gsm8k_table("train", 8), "test": gsm8k_table("test", 3)}
    )
    run = tmp_path / "run"
    args = [
        *TINY,
        "task=hf:streamrl-test/train-me",
        "task_config.columns={prompt: question, id: uid}",
        "reward.extract=gsm8k",
        "eval.size=3",
        "eval.before=true",
        "max_steps=2",
        f"run_dir={run}",
    ]
    assert main(["train", *args]) == 0
    trained = {json.loads(x)["problem_id"] for x in (run / "groups.jsonl").read_text().splitlines()}
    assert trained and trained <= {f"train-{i}" for i in range(8)}
    evals = json.loads((run / "eval.json").read_text())
    assert {s["id"] for s in evals["samples"]["base"]} == {"test-0", "test-1", "test-2"}
    assert {s["answer"] for s in evals["samples"]["base"]} == {"0", "2000", "4000"}
