"""benchmarks/vs_trl.py: the streamrl -> TRL settings mapping, the reward function TRL trains on, the
list of what cannot be matched, and the message when trl is missing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import trl_settings  # noqa: E402
import vs_trl  # noqa: E402
from vs_trl_sides import RewardFromTask, prompt_ids_identical  # noqa: E402

from streamrl.config import load_config  # noqa: E402
from streamrl.tasks import task_from_config  # noqa: E402


def test_default_job_maps_to_the_grpo_fields_of_the_same_job():
    cfg = load_config(None, [])
    kw = trl_settings.grpo_config_kwargs(cfg, steps=10, micro_batch=16, output_dir="out")
    expected = {
        "max_steps": 10,
        "num_generations": 8,  # rollout.samples_per_prompt
        "generation_batch_size": 64,  # 8 prompts x 8 samples: one generation per optimizer step
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 4,  # 64 / 16
        "num_iterations": 1,
        "max_completion_length": 48,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "learning_rate": 2e-5,
        "adam_beta1": 0.9,
        "adam_beta2": 0.99,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "lr_scheduler_type": "constant",
        "loss_type": "dapo",  # token sum / tokens of the whole accumulated batch = token-mean
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "beta": 0.0,
        "scale_rewards": "group",
        "bf16": True,  # streamrl's default train.precision=bf16 (fp32 master weights + bf16 autocast)
        "gradient_checkpointing": False,
        "use_cpu": True,
        "use_vllm": False,
        "shuffle_dataset": False,
        "seed": 0,
        "output_dir": "out",
    }
    assert {k: kw[k] for k in expected} == expected


def test_overrides_reach_the_trl_fields():
    cfg = load_config(
        None,
        [
            "rollout.max_new_tokens=32",
            "rollout.samples_per_prompt=4",
            "train.lr=1e-5",
            "train.warmup_steps=3",
        ],
    )
    kw = trl_settings.grpo_config_kwargs(cfg, steps=2, micro_batch=8, output_dir="o")
    assert (kw["max_completion_length"], kw["num_generations"], kw["generation_batch_size"]) == (32, 4, 32)
    assert (kw["gradient_accumulation_steps"], kw["learning_rate"], kw["warmup_steps"]) == (4, 1e-5, 3)
    assert kw["lr_scheduler_type"] == "constant_with_warmup"
    with pytest.raises(ValueError, match="micro_batch 5 does not divide 32"):
        trl_settings.grpo_config_kwargs(cfg, steps=2, micro_batch=5, output_dir="o")


@pytest.mark.parametrize(
    "samples,budget,seq,expected",
    [(64, 4096, 98, 32), (64, 4096, 200, 16), (64, 100, 5000, 1), (12, 4096, 1000, 4), (64, 10**6, 10, 64)],
)
def test_micro_batch_is_the_largest_divisor_within_the_token_budget(samples, budget, seq, expected):
    assert trl_settings.micro_batch_size(samples, budget, seq) == expected


def test_settings_without_a_trl_counterpart_are_refused_by_name():
    cfg = load_config(None, ["advantage.name=rloo"])
    with pytest.raises(
        ValueError, match="advantage.name='rloo' has no TRL counterpart.*use advantage.name='grpo'"
    ):
        trl_settings.grpo_config_kwargs(cfg, steps=1, micro_batch=8, output_dir="o")
    with pytest.raises(ValueError, match="loss.kl_coef=0.1"):
        trl_settings.check_supported(load_config(None, ["loss.kl_coef=0.1"]))


def test_unmatched_settings_name_the_known_differences():
    lines = trl_settings.unmatched_settings(load_config(None, []))
    text = "\n".join(lines)
    for known in (
        "synchronous",
        "transformers `generate`",
        "threads",
        "pi_prox/pi_behav",
        "dynamic sampling",
    ):
        assert known in text, known
    no_ds = trl_settings.unmatched_settings(load_config(None, ["rollout.dynamic_sampling=false"]))
    assert len(no_ds) == len(lines) - 1 and not any("dynamic sampling" in x for x in no_ds)


def test_trl_accepts_the_mapping_and_aligns_generation_with_the_optimizer_step():
    trl = pytest.importorskip("trl")
    kw = trl_settings.grpo_config_kwargs(load_config(None, []), steps=3, micro_batch=16, output_dir="/tmp/x")
    args = trl.GRPOConfig(**kw)
    # one generation batch of 64 per optimizer step of 4 accumulated micro-batches: on-policy, ratio 1
    assert (args.generation_batch_size, args.steps_per_generation, args.gradient_accumulation_steps) == (
        64,
        4,
        4,
    )
    assert args.gradient_checkpointing is False and args.bf16 is True and args.epsilon_high == 0.28


def test_reward_function_scores_like_streamrl():
    cfg = load_config(None, ["reward.length_penalty=0.01"])
    task = task_from_config(cfg)
    problems = task.heldout(2)
    answer = problems[1].answer
    reward = RewardFromTask(cfg, task, problems)
    completions = [
        [{"role": "assistant", "content": f"The answer is {answer}."}],  # correct + format: 1 + 0.1
        [{"role": "assistant", "content": "The answer is 99999."}],  # format only: 0.1
        [{"role": "assistant", "content": "no idea"}],  # nothing: 0
    ]
    out = reward(
        prompts=[None] * 3, completions=completions, completion_ids=[[0] * 5] * 3, problem_index=[1] * 3
    )
    assert out == pytest.approx([1.1 - 0.05, 0.1 - 0.05, -0.05])  # minus length_penalty * 5 tokens each
    assert (reward.samples, reward.gen_tokens, reward.correct) == (3, 15, 1)
    assert reward.last_accuracy == pytest.approx(1 / 3)


def test_trl_and_streamrl_tokenize_the_same_prompts_to_the_same_ids():
    from streamrl.models.tiny import build_tokenizer

    cfg = load_config(None, [])
    chats = [p.messages for p in task_from_config(cfg).heldout(8)]
    assert chats[0][0]["role"] == "system" and chats[0][-1]["role"] == "user"
    assert prompt_ids_identical(build_tokenizer(), chats) == 8


def test_missing_trl_prints_the_install_hint(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        vs_trl.importlib.util, "find_spec", lambda name: None if name == "trl" else real(name)
    )
    with pytest.raises(SystemExit, match=r"pip install 'streamrl\[bench\]'"):
        vs_trl.main(["--model", "tiny", "--steps", "1"])


def test_accuracy_diff_ci_matches_hand_computation() -> None:
    # p1 = 0.5, p2 = 0.4: se = sqrt(0.25 / 200 + 0.24 / 200) = 0.0494975, half-width 1.96 se = 0.0970151
    diff, lo, hi = vs_trl.accuracy_diff_ci(100, 200, 80, 200)
    assert diff == pytest.approx(0.1)
    assert lo == pytest.approx(0.1 - 0.0970151, abs=1e-6)
    assert hi == pytest.approx(0.1 + 0.0970151, abs=1e-6)


def test_seed_summary_pools_seeds() -> None:
    def side(sps: float, correct: int) -> dict:
        return {"samples_per_s": sps, "after": {"correct": correct, "n": 100, "accuracy": correct / 100}}

    runs = {
        0: {"streamrl": side(6.0, 50), "trl": side(2.0, 45)},
        1: {"streamrl": side(9.0, 40), "trl": side(2.5, 47)},
    }
    out = vs_trl.seed_summary(runs)
    assert out["per_seed_samples_ratio"] == {0: pytest.approx(3.0), 1: pytest.approx(3.6)}
    assert out["samples_ratio_of_means"] == pytest.approx(7.5 / 2.25)
    assert out["pooled_accuracy"] == {"streamrl": [90, 200], "trl": [92, 200]}
    assert out["accuracy_diff"] == pytest.approx(-0.01)
