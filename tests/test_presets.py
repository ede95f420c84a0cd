"""Every algorithm preset runs end to end on tiny-random, and each changes what it says it changes."""

import json
import statistics

import pytest
from tiny_args import TINY

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.presets import describe, names


def test_preset_names_and_descriptions():
    assert names() == [
        "cispo",
        "dapo",
        "dr_grpo",
        "grpo",
        "gspo",
        "m2po",
        "ppo_gae",
        "reinforce_pp",
        "remax",
        "rloo",
    ]
    assert all(describe(n) for n in names())


def test_preset_layers_under_user_settings(tmp_path):
    cfg = load_config(None, ["algo=dapo"])
    assert (cfg.loss.eps_low, cfg.loss.eps_high, cfg.loss.aggregation) == (0.2, 0.28, "token-mean")
    assert cfg.rollout.dynamic_sampling and cfg.reward.overlong_buffer == 16
    assert load_config(None, ["algo=dapo", "loss.eps_high=0.3"]).loss.eps_high == 0.3  # overrides win
    # ReMax's gradient sums each response's tokens (a long answer weighs more), GRPO averages them
    assert load_config(None, ["algo=remax"]).loss.aggregation == "token-mean"
    assert load_config(None, ["algo=grpo"]).loss.aggregation == "seq-mean-token-mean"
    # dynamic sampling is DAPO's: every other preset trains on every group, as its paper does
    assert [n for n in names() if load_config(None, [f"algo={n}"]).rollout.dynamic_sampling] == ["dapo"]
    assert load_config(None, ["algo=grpo", "rollout.dynamic_sampling=true"]).rollout.dynamic_sampling
    f = tmp_path / "c.yaml"
    f.write_text("algo: gspo\nloss:\n  eps_high: 0.001\n")
    cfg = load_config(f)
    assert (cfg.loss.name, cfg.loss.eps_low, cfg.loss.eps_high) == ("gspo", 0.0003, 0.001)


@pytest.mark.parametrize("preset", names())
def test_preset_trains_end_to_end(tmp_path, preset):
    run = tmp_path / preset
    mode = (
        ["runtime.mode=async"]
        if preset in ("m2po", "remax")
        else ["runtime.mode=colocated", "max_staleness=0"]
    )
    # reinforce_pp with dynamic sampling asked for: under its batch baseline the filter drops no group
    ds = ["rollout.dynamic_sampling=true"] if preset == "reinforce_pp" else []
    assert main(["train", f"algo={preset}", *TINY, *mode, *ds, "max_steps=2", f"run_dir={run}"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]
    cfg = load_config(run / "config.yaml")
    assert cfg.algo == preset
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 4
    groups = [json.loads(x) for x in (run / "groups.jsonl").read_text().splitlines()]
    _assert_loss_metrics(preset, rows)
    _assert_advantages(preset, groups)
    if preset == "grpo":
        assert all("kl_ref" in r for r in rows)  # the reference model is loaded and the KL logged
    if preset == "dapo":
        assert acc["filtered"] == acc["filter_reasons"].get("zero_variance", 0)
        assert all(
            r["zero_adv_group_frac"] == 0 for r in rows
        )  # dynamic sampling kept only informative groups
    if preset == "reinforce_pp":  # the batch baseline: an all-equal group has an advantage, none is dropped
        assert acc["filtered"] == 0 and cfg.rollout.dynamic_sampling
        assert any(len(set(g["rewards"])) == 1 for g in groups)  # groups of equal rewards were trained
    if preset == "remax":  # the worker decoded a greedy baseline per group and it was not trained on
        assert all(0 <= r["greedy_reward_mean"] <= 1.1 for r in rows)
        assert all(r["tokens_generated"] > r["response_length"] * 8 for r in rows)
    if preset == "ppo_gae":
        assert all("value_loss" in r and "value_clip_frac" in r for r in rows)  # the value head trains


def test_remax_colocated_decodes_one_greedy_baseline_per_group(tmp_path):
    run = tmp_path / "remax"
    args = ["train", "algo=remax", *TINY, "runtime.mode=colocated", "max_staleness=0", "max_steps=1"]
    assert main([*args, f"run_dir={run}", "rollout.dynamic_sampling=false"]) == 0
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    groups = [json.loads(x) for x in (run / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 2 and all(len(g["rewards"]) == 4 for g in groups)  # greedy not among samples
    assert row["greedy_reward_mean"] == sum(g["greedy_reward"] for g in groups) / 2


def test_ppo_gae_with_bf16_and_ppo_mini_batches(tmp_path):
    run = tmp_path / "gae"
    args = ["train", "algo=ppo_gae", *TINY, "runtime.mode=colocated", "max_staleness=0", "max_steps=2"]
    extra = ["train.precision=bf16", "train.mini_batches=2", "train.token_budget=200"]
    assert main([*args, *extra, f"run_dir={run}"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]  # two optimizer steps per batch, one version
    assert all(r["optimizer_steps"] == 2 and r["micro_batches"] >= 2 for r in rows)
    assert all(r["value_loss"] == r["value_loss"] and r["value_loss"] >= 0 for r in rows)  # not NaN


# The metric only each policy loss reports (algo/losses.py, algo/losses_is.py): a trainer that ran
# another loss than the preset names fails here.
LOSS_METRIC = {
    "ppo_clip": "clip_frac_low",
    "decoupled_ppo": "behav_weight_mean",
    "cispo": "is_clip_frac",
    "gspo": "seq_clip_frac",
    "m2po": "m2_masked_frac",
}


def _assert_loss_metrics(preset, rows):
    loss = load_config(None, [f"algo={preset}"]).loss.name
    expected = {LOSS_METRIC[loss]} if loss in LOSS_METRIC else set()  # reinforce reports none of them
    for r in rows:
        assert {m for m in LOSS_METRIC.values() if m in r} == expected, (preset, loss)


def _expected_advantages(name, rewards, greedy):
    """Hand-written estimators over one step's groups (rewards [groups][G]) -> [groups][G]."""
    out = []
    every = [x for g in rewards for x in g]
    for g, b in zip(rewards, greedy, strict=True):
        mean = sum(g) / len(g)
        if name == "grpo":
            out.append([(x - mean) / (statistics.stdev(g) + 1e-6) for x in g])
        elif name == "dr_grpo":
            out.append([x - mean for x in g])
        elif name == "rloo":
            out.append([x - (sum(g) - x) / (len(g) - 1) for x in g])
        elif name == "reinforce_pp":
            m, sd = sum(every) / len(every), statistics.stdev(every)
            out.append([(x - m) / (sd + 1e-6) for x in g])
        elif name == "remax":
            out.append([x - b for x in g])
        else:
            raise AssertionError(f"no reference for advantage '{name}'")
    return out


def _assert_advantages(preset, groups):
    """The advantages trained on (groups.jsonl) equal the preset's estimator applied by hand."""
    name = load_config(None, [f"algo={preset}"]).advantage.name
    if name == "gae":  # token-level: nothing per sample to log; the value head's metrics are checked
        assert all("advantages" not in g for g in groups)
        return
    for step in sorted({g["step"] for g in groups}):
        rows = [g for g in groups if g["step"] == step]
        want = _expected_advantages(
            name, [g["rewards"] for g in rows], [g.get("greedy_reward") for g in rows]
        )
        got = [a for g in rows for a in g["advantages"]]
        assert got == pytest.approx([a for w in want for a in w], abs=1e-5), (preset, step)
