"""benchmarks/vs_trl.py: the streamrl -> TRL settings mapping, the reward function TRL trains on, the
list of what cannot be matched, the message when trl is missing, and the time-to-accuracy arithmetic
(benchmarks/time_to_accuracy.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import time_to_accuracy as tta  # noqa: E402
import trl_settings  # noqa: E402
import vs_trl  # noqa: E402
from vs_trl_sides import RewardFromTask, progress_callback, prompt_ids_identical  # noqa: E402

from streamrl.config import load_config  # noqa: E402
from streamrl.eval.stats import paired_difference_interval  # noqa: E402
from streamrl.models import precision  # noqa: E402
from streamrl.tasks import task_from_config  # noqa: E402


def test_default_job_maps_to_the_grpo_fields_of_the_same_job(monkeypatch):
    monkeypatch.setattr(precision, "_cpu_bf16_matmul", lambda: True)  # a CPU with bf16 units
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
        "bf16": True,  # train.precision=auto on a CPU with bf16 units (fp32 master weights + bf16 autocast)
        "gradient_checkpointing": False,
        "use_cpu": True,
        "use_vllm": False,
        "shuffle_dataset": False,
        "seed": 0,
        "output_dir": "out",
    }
    assert {k: kw[k] for k in expected} == expected
    monkeypatch.setattr(precision, "_cpu_bf16_matmul", lambda: False)  # auto trains in fp32 there
    assert trl_settings.grpo_config_kwargs(cfg, steps=10, micro_batch=16, output_dir="out")["bf16"] is False


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


def test_trl_accepts_the_mapping_and_aligns_generation_with_the_optimizer_step(monkeypatch):
    trl = pytest.importorskip("trl")
    monkeypatch.setattr(precision, "_cpu_bf16_matmul", lambda: True)  # a CPU with bf16 units
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


def test_missing_trl_prints_the_install_hint(not_installed):
    not_installed("trl")
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


# ---- time to accuracy -------------------------------------------------------------------------------
# two curves on 4 held-out problems: (step, training seconds, verdicts)
STREAMRL = [
    tta.point(0, 0.0, [0, 0, 0, 0]),
    tta.point(2, 10.0, [1, 0, 0, 0]),
    tta.point(4, 20.0, [1, 1, 0, 0]),
    tta.point(6, 30.0, [1, 1, 1, 0]),
    tta.point(7, 35.0, [1, 1, 0, 0]),  # final
]
TRL = [tta.point(0, 0.0, [0, 0, 0, 0]), tta.point(2, 20.0, [0, 1, 0, 0]), tta.point(3, 30.0, [1, 1, 0, 0])]
# a second seed where streamrl's final time is the shorter one
STREAMRL_B = [tta.point(0, 0.0, [0, 0, 0, 0]), tta.point(5, 12.0, [1, 0, 0, 1])]
TRL_B = [tta.point(0, 0.0, [0, 0, 0, 0]), tta.point(1, 10.0, [0, 0, 1, 0]), tta.point(2, 25.0, [1, 1, 1, 1])]


def test_a_point_counts_its_verdicts():
    assert tta.point(3, 1.5, [True, False, 1, 0]) == {
        "step": 3,
        "seconds": 1.5,
        "accuracy": 0.5,
        "correct": 2,
        "n": 4,
        "per_problem": [1, 0, 1, 0],
    }


def test_time_to_reach_is_the_first_point_at_or_above_the_target():
    assert tta.time_to_reach(STREAMRL, 0.5) == 20.0  # exactly 0.5 counts
    assert tta.time_to_reach(STREAMRL, 0.6) == 30.0
    assert tta.time_to_reach(STREAMRL, 0.0) == 0.0  # the base model
    assert tta.time_to_reach(STREAMRL, 0.8) is None
    assert tta.time_to_reach(TRL, 0.5) == 30.0


def test_point_at_is_the_last_point_within_the_seconds():
    assert tta.point_at(STREAMRL, 30.0)["step"] == 6  # exactly 30 s counts
    assert tta.point_at(STREAMRL, 29.9)["step"] == 4
    assert tta.point_at(TRL, 35.0)["step"] == 3  # past the final point: the final weights
    assert tta.point_at(TRL, -1.0) is None


def test_speedup_is_trl_final_seconds_over_streamrl_seconds_to_trl_final_accuracy():
    assert tta.speedup(STREAMRL, TRL) == pytest.approx(30.0 / 20.0)  # TRL's 0.5 at 30 s; streamrl's at 20
    assert tta.speedup(TRL, STREAMRL) == pytest.approx(35.0 / 30.0)  # streamrl's 0.5 at 35 s; TRL's at 30
    assert tta.speedup(STREAMRL_B, TRL_B) is None  # TRL_B's final 1.0: never reached
    flat = [tta.point(0, 0.0, [0, 0, 0, 0]), tta.point(1, 5.0, [0, 0, 0, 0])]
    assert tta.speedup(STREAMRL, flat) is None  # flat's final 0.0: streamrl's base model has it at 0 s


def test_compare_one_seed():
    c = tta.compare(STREAMRL, TRL, target=0.75)
    assert c["seconds_to_target"] == {"streamrl": 30.0, "trl": None}
    assert c["streamrl_at_trl_final"] == {"step": 6, "seconds": 30.0, "accuracy": 0.75}
    assert c["trl_at_streamrl_final"] == {"step": 3, "seconds": 30.0, "accuracy": 0.5}
    assert c["streamrl_seconds_to_trl_final"] == 20.0
    assert c["speedup_to_trl_final"] == pytest.approx(1.5)
    assert c["equal_time"] == {
        "seconds": 30.0,  # min(35, 30)
        "streamrl": {"step": 6, "seconds": 30.0, "accuracy": 0.75},
        "trl": {"step": 3, "seconds": 30.0, "accuracy": 0.5},
    }
    assert tta.compare(STREAMRL, TRL, target=None)["seconds_to_target"] is None


def test_pooled_equal_time_pairs_the_problems_of_every_seed():
    out = tta.pooled_equal_time([(STREAMRL, TRL), (STREAMRL_B, TRL_B)])
    # seed A at 30 s: streamrl 1110, TRL 1100; seed B at 12 s: streamrl 1001 (final), TRL 0010 (step 1)
    assert out["streamrl"] == [5, 8] and out["trl"] == [3, 8]
    # d = streamrl - TRL = 0,0,1,0, 1,0,-1,1: mean 0.25, the 8 pairs in one paired interval (both 2,
    # gained 3, lost 1, neither 2), not each seed's alone
    assert out["difference"] == pytest.approx(0.25)
    trl_all, streamrl_all = [1, 1, 0, 0, 0, 0, 1, 0], [1, 1, 1, 0, 1, 0, 0, 1]
    whole = paired_difference_interval([bool(x) for x in trl_all], [bool(x) for x in streamrl_all])
    assert out["ci95"] == [pytest.approx(whole[1]), pytest.approx(whole[2])]
    assert whole[1] < 0 < 0.25 < whole[2] < 1
    # over seeds: d_A = 1/4 and d_B = 1/4, no spread between them
    assert out["ci95_over_seeds"] == [pytest.approx(0.25), pytest.approx(0.25)]
    three = tta.pooled_equal_time([(STREAMRL, TRL), (STREAMRL_B, TRL_B), (STREAMRL, STREAMRL)])
    # d = 1/4, 1/4, 0: mean 1/6, sd sqrt(((1/12)^2 * 2 + (1/6)^2) / 2) = 1/sqrt(48), t(0.975, 2) 4.302653
    half = 4.302653 / 48**0.5 / 3**0.5
    assert three["ci95_over_seeds"] == [pytest.approx(1 / 6 - half), pytest.approx(1 / 6 + half)]
    with pytest.raises(ValueError, match="different numbers of held-out problems"):
        tta.pooled_equal_time([(STREAMRL, [tta.point(0, 0.0, [0, 0])])])


def test_report_prints_each_run_and_the_pooled_difference(capsys):
    def side(curve, paused):
        return {"curve": curve, "paused_s": paused}

    runs = {
        "seed 0": {"streamrl": side(STREAMRL, 1.0), "trl": side(TRL, 2.0)},
        "seed 1": {"streamrl": side(STREAMRL_B, 0.5), "trl": side(TRL_B, 0.5)},
    }
    out = tta.report(runs, target=0.75)
    assert out["per_run"]["seed 0"] == tta.compare(STREAMRL, TRL, 0.75)
    assert out["pooled_equal_time"]["streamrl"] == [5, 8]
    lines = capsys.readouterr().out.splitlines()
    for line in (
        "    streamrl  step    6      30.0 s  0.750 (3/4)",
        "  time to 0.750: streamrl 30.0 s, TRL not reached",
        "  at TRL's final 30.0 s: streamrl 0.750 (step 6), TRL 0.500 (step 3)",
        "  at streamrl's final 35.0 s: streamrl 0.500 (step 7), TRL 0.500 (step 3)",
        "  TRL's final accuracy 0.500 reached 1.50x sooner by streamrl (20.0 s vs 30.0 s)",
        "  TRL's final accuracy 1.000: not reached by streamrl",
    ):
        assert line in lines, line
    paused = "streamrl 1.5 s (async: its rollout workers kept generating meanwhile), TRL 2.5 s"
    assert lines[-1].endswith(paused)
    assert tta.report({"run": {"streamrl": side(None, 0.0), "trl": side(TRL, 0.0)}}, None) is None


def test_pauses_counted_puts_the_wall_seconds_on_the_clock(capsys):
    # streamrl's points with its pauses counted: 20 -> 28 s, 30 -> 45 s, 35 -> 52 s
    walls = {0: 0.0, 2: 8.0, 4: 28.0, 6: 45.0, 7: 52.0}
    with_walls = [{**p, "wall_seconds": walls[p["step"]]} for p in STREAMRL]
    counted = tta.pauses_counted(with_walls)
    assert [p["seconds"] for p in counted] == [walls[p["step"]] for p in STREAMRL]
    assert [p["accuracy"] for p in counted] == [p["accuracy"] for p in STREAMRL]
    assert tta.pauses_counted(STREAMRL) is None  # TRL's side and older results carry no wall seconds
    out = tta.report({"seed 0": {"streamrl": {"curve": with_walls}, "trl": {"curve": TRL}}}, target=None)[
        "pauses_counted"
    ]
    # TRL's final 0.5 at 30 s; streamrl's first 0.5 now at 28 s (step 4) instead of 20 s
    assert out["speedup_to_trl_final"] == {"seed 0": pytest.approx(30.0 / 28.0)}
    assert out["pooled_equal_time"] == tta.pooled_equal_time([(counted, TRL)])
    assert "by seed 0 1.07x" in capsys.readouterr().out


class FakeTime:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _trl_steps(budget_s: float, steps: int, every: int, run: int) -> tuple[object, list[int], object]:
    """Drive the TRL side's callback through `run` optimizer steps of 10 s each; a save takes 100 s."""
    from types import SimpleNamespace

    fake, saved = FakeTime(), []

    def save(step: int, model: object) -> None:
        assert model == "the model"
        fake.t += 100.0
        saved.append(step)

    cb = progress_callback(budget_s, steps, None, every, save, now=fake)
    state, control = SimpleNamespace(global_step=0), SimpleNamespace(should_training_stop=False)
    cb.on_train_begin(None, state, control)
    for step in range(1, run + 1):
        fake.t += 10.0
        state.global_step = step
        cb.on_step_end(None, state, control, model="the model")
    return cb, saved, control


def test_trl_side_saves_every_k_steps_with_its_clock_paused():
    cb, saved, control = _trl_steps(budget_s=0.0, steps=4, every=2, run=4)
    assert saved == [2]  # not the last step: the final weights are saved and evaluated anyway
    assert cb.seconds == {1: 10.0, 2: 20.0, 3: 30.0, 4: 40.0}
    assert cb.clock.paused == 100.0 and not control.should_training_stop


def test_trl_side_budget_counts_saves_and_stops_without_saving():
    # step 1 at 10 s: saved (110 s of wall time); step 2 at 120 s >= 25: stop, no save
    cb, saved, control = _trl_steps(budget_s=25.0, steps=10, every=1, run=2)
    assert saved == [1] and control.should_training_stop
    assert cb.seconds == {1: 10.0, 2: 20.0}


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--time-to-accuracy", "40", "--eval-every", "5"], "--time-to-accuracy 40: give the held-out"),
        (["--time-to-accuracy", "0.4"], "--time-to-accuracy needs --eval-every K"),
        (["--eval-every", "-1"], "--eval-every -1: give K >= 1"),
    ],
)
def test_bad_time_to_accuracy_options_exit_2_before_any_work(argv, message, tmp_path, capsys, monkeypatch):
    work = tmp_path / "work"

    def started(*_):
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(vs_trl, "settings_report", started)
    with pytest.raises(SystemExit) as exc:
        vs_trl.main(["--model", "tiny", "--workdir", str(work), *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"vs_trl: error: {message}")
    assert not work.exists()
