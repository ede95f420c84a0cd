"""Diagnostics rules fire on synthetic streams built to trigger each one and stay silent on a healthy one."""

from __future__ import annotations

import pytest

from streamrl.observe.diagnostics import RULES, DiagnosticsMonitor, diagnose


def healthy(n: int = 12) -> list[dict]:
    """A plausible, uneventful run: entropy drifting down slowly, moderate KL, balanced waiting."""
    return [
        {
            "step": i,
            "reward_mean": 0.2 + 0.02 * i,
            "zero_adv_group_frac": 0.25,
            "entropy": 1.5 - 0.02 * i,
            "ratio_max": 1.6,
            "ratio_min": 0.7,
            "kl_ref": 0.02 + 0.001 * i,
            "approx_kl": 0.01,
            "truncation_rate": 0.1,
            "trainer_wait_share": 0.3,
            "engine_idle_share": 0.2,
            "episodes": 100,
            "episode_errors": 1,  # 1%: at the threshold, not above it
            "episode_error_reasons": {"RuntimeError": 1},
            "rewards_scored": 100,
            "reward_errors": 3,  # 1 failed (at the threshold) and 2 cut off by the step budget
            "reward_error_reasons": {"TypeError": 1, "step_budget": 2},
        }
        for i in range(1, n + 1)
    ]


def with_tail(key: str, values: list[float], n: int = 12) -> list[dict]:
    """The healthy stream with `key` overwritten on the last len(values) steps."""
    rows = healthy(n)
    for r, v in zip(rows[-len(values) :], values):
        r[key] = v
    return rows


def flat_reward(rows: list[dict]) -> list[dict]:
    for r in rows:
        r["reward_mean"] = 0.3
    return rows


TRIGGERS = {
    "non_finite": with_tail("loss", [float("nan")]),
    "entropy_collapse": flat_reward(with_tail("entropy", [0.05])),
    "entropy_explosion": with_tail("entropy", [4.0]),
    "reward_stuck": with_tail("zero_adv_group_frac", [1.0, 1.0, 1.0]),
    "ratio_explosion": with_tail("ratio_max", [25.0]),
    "kl_spike": with_tail("kl_ref", [0.5]),
    "truncation_high": with_tail("truncation_rate", [0.8]),
    "trainer_starved": with_tail("trainer_wait_share", [0.9]),
    "engine_idle": with_tail("engine_idle_share", [0.75]),
    "rollout_correction_masks": with_tail("rc_token_masked_frac", [0.95]),
    "episode_errors": with_tail("episode_errors", [2]),
    "scoring_budget": with_tail("reward_step_budget_expired", [3]),
    "reward_errors": with_tail("reward_error_reasons", [{"TypeError": 2, "step_budget": 2}]),
}


def test_every_rule_has_a_trigger():
    assert set(TRIGGERS) == {r.name for r in RULES}


@pytest.mark.parametrize("rule", sorted(TRIGGERS))
def test_rule_fires_alone_on_its_trigger(rule):
    found = diagnose(TRIGGERS[rule])
    assert [f.rule for f in found] == [rule]
    assert found[0].steps == [12]  # every trigger completes at the last step


def test_healthy_stream_is_silent():
    assert diagnose(healthy()) == []
    assert diagnose([]) == []


def test_reward_stuck_needs_consecutive_steps():
    rows = with_tail("zero_adv_group_frac", [1.0, 0.5, 1.0, 1.0])
    assert diagnose(rows) == []


def test_ratio_mean_drift_fires_but_a_small_token_min_does_not():
    assert [f.rule for f in diagnose(with_tail("ratio_mean", [3.0]))] == ["ratio_explosion"]
    assert diagnose(with_tail("ratio_min", [0.01])) == []


def test_shares_ignored_in_the_first_steps():
    rows = healthy(2)
    rows[0]["trainer_wait_share"] = rows[1]["trainer_wait_share"] = 0.95  # the first batch always waits
    assert diagnose(rows) == []


def test_monitor_warns_once_per_rule_when_it_starts_firing():
    lines: list[str] = []
    mon = DiagnosticsMonitor(emit=lines.append)
    stream = with_tail("truncation_rate", [0.9, 0.9, 0.9, 0.1, 0.9])
    fired_at = [r["step"] for r in stream if mon.update(r)]
    assert fired_at == [8]
    assert len(lines) == 1 and lines[0].startswith("warning [truncation_high] step 8:")


def test_scoring_budget_message_counts_the_scores_cut_off():
    lines: list[str] = []
    mon = DiagnosticsMonitor(emit=lines.append)
    for r in with_tail("reward_step_budget_expired", [0, 5, 2], n=4):
        mon.update(r)
    assert lines == [
        "warning [scoring_budget] step 3: 5 score(s) were still outstanding when reward.step_budget_s ran "
        "out and count as reward 0: the scorer (an LLM judge, the sandbox, your reward functions) is slow "
        "or hanging"
    ]


def test_missing_and_non_finite_values_are_ignored():
    """by every rule but non_finite, which names them"""
    rows = [{"step": i, "entropy": float("nan"), "ratio_max": None, "truncation_rate": "x"} for i in range(5)]
    assert [(f.rule, f.steps) for f in diagnose(rows)] == [("non_finite", [0, 1, 2, 3, 4])]


def test_non_finite_metrics_are_named_at_every_step_they_appear():
    """A diverged run: NaN or inf in memory, or the keys metrics.jsonl wrote as null (read back under
    "non_finite"); whole numbers and flags never are."""
    rows = healthy(6)
    rows[3].update(loss=float("nan"), kl_ref=float("-inf"), entropy=float("inf"))
    rows[5].update(non_finite=["grad_norm", "loss"], loss=None, optimizer_steps=1, lends=True)
    lines: list[str] = []
    mon = DiagnosticsMonitor(emit=lines.append)
    for r in rows:
        mon.update(r)
    assert lines == [
        "warning [non_finite] step 4: 3 metric(s) are NaN or infinite (entropy, kl_ref, loss): the run "
        "diverged; start a new run from a model saved before it (model=RUN/checkpoints/step-N or "
        "RUN/state/step-N/model) with a lower train.lr, or look for a reward or loss term that overflows"
    ]
    (found,) = mon.findings()
    assert found.steps == [4, 6] and "(grad_norm, loss)" in found.last_message
    many = {"step": 1, **{f"m{i}": float("nan") for i in range(10)}}
    assert "(m0, m1, m2, m3, m4, m5, m6, m7 and 2 more)" in diagnose([many])[0].first_message


def test_episode_errors_warn_above_one_percent_with_the_reasons():
    rows = healthy(3)
    rows[-1].update(
        episodes=128, episode_errors=34, episode_error_reasons={"APIConnectionError": 30, "KeyError": 4}
    )
    (found,) = diagnose(rows)
    assert found.rule == "episode_errors" and found.steps == [3]
    assert found.first_message == (
        "34 of 128 agent episodes (26.6%) ended in an error (> 1%): APIConnectionError x30, KeyError x4; "
        "each costs its episode's reward: the first message of each kind was printed, and each step's are in "
        "metrics.jsonl episode_error_examples"
    )
    rows[-1].update(episodes=0, episode_errors=0)  # a step without agent episodes says nothing
    assert diagnose(rows) == []


def test_entropy_falling_while_the_reward_rises_is_convergence_not_collapse():
    rising = with_tail("entropy", [0.05])  # reward 0.22 -> 0.44 over the run (healthy)
    assert diagnose(rising) == []
    barely = flat_reward(with_tail("entropy", [0.05]))
    for r in barely[-3:]:
        r["reward_mean"] = 0.349  # the last three 0.049 above the first three: not a rise
    assert [f.rule for f in diagnose(barely)] == ["entropy_collapse"]
    for r in barely[-3:]:
        r["reward_mean"] = 0.351
    assert diagnose(barely) == []


def test_a_waiting_trainer_whose_cores_generate_is_not_starved():
    rows = with_tail("trainer_wait_share", [0.9])
    rows[-1]["cores_total"] = 2  # elastic cores: its cores decoded while it waited
    assert diagnose(rows) == []
    msg = diagnose(with_tail("trainer_wait_share", [0.9]))[0].last_message
    assert msg == (
        "the trainer waited for rollouts 90% of the time (> 50%) with its cores idle: set "
        "runtime.elastic_cores=lend, or add rollout capacity (runtime.rollout_workers, threads)"
    )


def test_an_idle_engine_whose_cores_train_is_not_flagged():
    rows = with_tail("engine_idle_share", [0.75])
    rows[-1]["cores_total"] = 2  # elastic cores: the engine's threads trained while it idled
    assert diagnose(rows) == []
    msg = diagnose(with_tail("engine_idle_share", [0.75]))[0].last_message
    assert msg == (
        "rollout engines idled 75% of the time (> 50%): the trainer or the staleness bound is the "
        "bottleneck (raise max_staleness or trainer threads)"
    )


def test_a_correction_that_masks_most_tokens_names_the_keys_to_loosen():
    assert diagnose(with_tail("rc_token_masked_frac", [0.5])) == []  # at the threshold: silent
    msg = diagnose(with_tail("rc_token_masked_frac", [0.9528]))[0].last_message
    assert msg == (
        "loss.rollout_correction masked 95% of the step's tokens (> 50%): training sees few of them; "
        "loosen its thresholds (loss.rc_geo_tol, rc_lower, rc_upper) to the engine/trainer gap "
        "(rc_ratio_mean, rc_ratio_max) or choose another correction"
    )


def test_reward_errors_warn_above_one_percent_with_the_reasons_but_not_the_step_budget():
    rows = healthy(3)
    rows[-1].update(
        rewards_scored=64,
        reward_errors=40,
        reward_error_reasons={"TypeError": 30, "timeout": 2, "step_budget": 8},
    )
    found = diagnose(rows)
    assert [f.rule for f in found] == ["reward_errors"] and found[0].steps == [3]
    assert found[0].first_message == (
        "32 of 64 rewards (50.0%) failed and count as 0 (> 1%): TypeError x30, timeout x2; "
        "the first message of each kind was printed, and each step's are in metrics.jsonl "
        "reward_error_examples: fix the reward function or scorer, or raise reward.timeout_s"
    )
    rows[-1].update(reward_errors=8, reward_error_reasons={"step_budget": 8})  # the budget's own rule
    assert diagnose(rows) == []


def test_a_resumed_monitor_knows_the_runs_earlier_steps():
    """Seeded with the steps before a resume: a rule that fired then does not warn again, and entropy is
    compared with the run's first value, not the first after the resume."""
    rows = flat_reward(with_tail("entropy", [0.05, 0.05, 0.05, 0.05, 0.05, 0.05]))
    lines: list[str] = []
    mon = DiagnosticsMonitor(emit=lines.append, history=rows[:8])
    assert lines == [] and [f.rule for f in mon.findings()] == ["entropy_collapse"]
    for r in rows[8:]:
        mon.update(r)
    assert lines == []  # fired before the resume: not again
    assert mon.findings() == diagnose(rows)  # the same findings as a replay of the whole run
    fresh = DiagnosticsMonitor(emit=lines.append)
    for r in rows[8:]:  # without the earlier steps: 0.05 is its "first" entropy, and nothing collapses
        fresh.update(r)
    assert fresh.findings() == []


def test_the_monitors_kept_series_give_what_the_rules_give_on_plain_lists():
    """A long random stream (values missing, non-finite, repeated, jumping): at every step the monitor's
    warnings and findings are those of each rule called on the plain list of the records so far."""
    import random

    rng = random.Random(5)
    keys = ["reward_mean", "entropy", "kl_ref", "approx_kl", "zero_adv_group_frac", "ratio_max"]
    rows = []
    for i in range(1, 301):
        r: dict = {"step": i}
        for key in keys:
            roll = rng.random()
            if roll < 0.15:
                continue  # not logged this step
            r[key] = float("nan") if roll < 0.2 else rng.choice([0.02, 0.05, 1.0, rng.uniform(0, 3)])
        rows.append(r)
    mon = DiagnosticsMonitor()
    fired: set[str] = set()
    for i, r in enumerate(rows):
        expected = [
            f"warning [{rule.name}] step {r['step']}: {msg}"
            for rule in RULES
            if (msg := rule(rows[: i + 1])) is not None and rule.name not in fired
        ]
        fired |= {line.split("]")[0][9:] for line in expected}
        assert mon.update(r) == expected, f"step {r['step']}"
    steps = {
        rule.name: [r["step"] for i, r in enumerate(rows) if rule(rows[: i + 1]) is not None]
        for rule in RULES
    }
    assert {f.rule: f.steps for f in mon.findings()} == {k: v for k, v in steps.items() if v}
    assert {"kl_spike", "entropy_explosion"} <= fired  # the stream exercises the rules with kept series


def test_the_median_before_the_last_value_drops_one_copy_of_it():
    from streamrl.observe.history import History, median_before_last

    h = History()
    h.series("kl_ref")  # tracked from here on: later values are kept incrementally
    for v in [0.5, 0.1, 0.3, 0.2]:
        h.append({"kl_ref": v})
    assert median_before_last(h, "kl_ref") == (0.3, 3)  # of 0.5, 0.1, 0.3
    h.append({"kl_ref": 0.1})
    assert median_before_last(h, "kl_ref") == (0.25, 4)  # of 0.1, 0.2, 0.3, 0.5
    h.append({"entropy": 2.0})  # a record without the key changes nothing kept for it
    assert h.series("kl_ref") == [0.5, 0.1, 0.3, 0.2, 0.1]
    assert h.sorted_series("kl_ref") == [0.1, 0.1, 0.2, 0.3, 0.5]
    assert median_before_last([{"kl_ref": 0.2}, {"kl_ref": 0.6}, {"kl_ref": 9.0}], "kl_ref") == (0.4, 2)


def test_the_docs_list_every_rule_with_its_threshold():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "diagnostics.md").read_text()
    rows = {
        line.split("|")[1].strip(" `"): line.split("|")[3].strip()
        for line in doc.splitlines()
        if "| `" in line
    }
    assert rows == {r.name: f"{r.threshold:g}" for r in RULES}
