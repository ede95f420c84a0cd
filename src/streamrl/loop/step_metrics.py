"""The metrics record of one trained batch (shared by the colocated and the async loops)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from streamrl.observe.error_examples import fit_message
from streamrl.types import BUDGET_REASON, TIMEOUT_REASONS, Group


def step_record(
    step: int,
    groups: list[Group],
    train: dict[str, float],
    version_before: int,
    advantages: list[float] | None = None,
    group_baseline: bool = True,
) -> dict[str, Any]:
    """Reward, accuracy, lengths and staleness over the batch; `train` are the trainer's metrics.

    Staleness of a token = the trainer's version when training it - the version that generated it.
    """
    trajs = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajs]
    outcomes = [o for g in groups for o in _outcomes(g)]
    lengths = [len(t.completion_ids) for t in trajs]
    gen_tokens = sum(lengths)
    baseline_tokens = sum(len(g.baseline.completion_ids) for g in groups if g.baseline is not None)
    staleness = [version_before - v for t in trajs for v, m in zip(t.versions, t.loss_mask) if m]
    hist = Counter(staleness)
    return {
        "step": step,
        "policy_version": version_before + 1,
        "reward_mean": statistics.fmean(r for r, _, _ in outcomes),
        "reward_std": statistics.pstdev([r for r, _, _ in outcomes]),
        "accuracy": statistics.fmean(float(c) for _, c, _ in outcomes),
        "format_rate": statistics.fmean(float(f) for _, _, f in outcomes),
        "zero_adv_group_frac": _zero_advantage_share(groups, rewards, group_baseline),
        "response_length": gen_tokens / len(trajs),
        "response_length_std": statistics.pstdev(lengths),
        "response_length_max": max(lengths),
        "truncation_rate": statistics.fmean(float(t.finish_reason == "length") for t in trajs),
        "tokens_generated": gen_tokens + baseline_tokens,
        "staleness_max": max(staleness, default=0),
        "staleness_mean": statistics.fmean(staleness) if staleness else 0.0,
        "staleness_hist": {str(k): hist[k] for k in sorted(hist)},
        **_advantage_stats(advantages or []),
        **speculative_stats(trajs),
        **_baseline_stats(groups),
        **_scoring_stats(trajs),
        **_per_function_means(trajs),
        **train,
    }


def _outcomes(g: Group) -> list[tuple[float, bool, bool]]:
    """(reward, correct, formatted) of each sample: an agent group's episodes (each once, however many
    trajectories its calls made, none included), else its trajectories."""
    if g.episode_rewards is not None and g.episode_correct is not None and g.episode_formatted is not None:
        return list(zip(g.episode_rewards, g.episode_correct, g.episode_formatted, strict=True))
    return [(t.reward, t.correct, bool(t.reward_info.get("formatted", False))) for t in g.trajectories]


def speculative_stats(trajs: list[Any]) -> dict[str, float]:
    """Speculative rollouts, over the samples offered a draft (whether or not the drafts' tree, cut to
    the nodes rollout.spec_branch_min drafts share, kept any token to verify): draft tokens verified and
    the share accepted (0 when none was verified), accepted tokens per draft, and the decode steps saved
    (a row emits the tokens along its path of the drafts' tree without a decode step of its own,
    accepted or drawn from the residual; a sample whose every token is on the tree saves one fewer, as
    its first token costs no decode step in plain sampling either); the shares of samples offered a
    draft and of generated tokens from the drafts' tree."""
    drafted = [t for t in trajs if t.drafted or t.draft_tokens]
    if not drafted:
        return {}
    accepted = sum(t.draft_accepted for t in drafted)
    verified = sum(t.draft_tokens for t in drafted)
    reused = sum(t.tree_tokens for t in drafted)
    inside = sum(0 < t.tree_tokens == len(t.completion_ids) for t in drafted)  # ended on the tree
    return {
        "spec_verified_tokens": verified,
        "spec_acceptance_rate": accepted / verified if verified else 0.0,
        "spec_accepted_per_draft": accepted / len(drafted),
        "spec_decode_steps_saved": reused - inside,
        "spec_draft_share": len(drafted) / len(trajs),
        "spec_token_share": reused / max(1, sum(len(t.completion_ids) for t in trajs)),
    }


def _per_function_means(trajs: list[Any]) -> dict[str, float]:
    """reward/<name>: each reward function's mean over the samples it applied to (reward.fns)."""
    values: dict[str, list[float]] = {}
    for t in trajs:
        for k, v in t.reward_info.items():
            if k.startswith("reward/") and v is not None:
                values.setdefault(k, []).append(v)
    return {k: statistics.fmean(v) for k, v in sorted(values.items())}


def _scoring_stats(trajs: list[Any]) -> dict[str, Any]:
    """How scoring went: failures by reason (reward 0 each) and the first message of each reason,
    latency, cache hits, and the task's verdicts
    that failed under a reward of your functions alone (counted as wrong). Timeouts are the
    scores past reward.timeout_s ("timeout"), a judge's requests past reward.judge_timeout_s
    ("JudgeError/timeout") and those still outstanding when the step's reward.step_budget_s ran out
    ("step_budget", also counted apart)."""
    infos = [t.reward_info for t in trajs if "reward_latency_s" in t.reward_info]
    if not infos:
        return {}
    errors = Counter(i["reward_error"] for i in infos if i["reward_error"])
    # the task's verdicts that failed where the reward is your functions' alone: their accuracy only
    verdicts = Counter(i["verdict_error"] for i in infos if i.get("verdict_error"))
    return {
        "rewards_scored": len(infos),
        "reward_errors": sum(errors.values()),
        "reward_timeouts": sum(errors.get(k, 0) for k in (*TIMEOUT_REASONS, BUDGET_REASON)),
        "reward_step_budget_expired": errors.get(BUDGET_REASON, 0),
        "reward_error_reasons": dict(errors),
        "reward_error_examples": _examples(infos, "reward_error"),
        "reward_latency_mean_s": statistics.fmean(i["reward_latency_s"] for i in infos),
        "reward_cache_hit_rate": statistics.fmean(float(i["reward_cached"]) for i in infos),
        **(
            {
                "verdict_errors": verdicts.total(),
                "verdict_error_reasons": dict(verdicts),
                "verdict_error_examples": _examples(infos, "verdict_error"),
            }
            if verdicts
            else {}
        ),
    }


def first_messages(
    failures: Iterable[tuple[str | None, Any]], known: Mapping[str, str] | None = None
) -> dict[str, str]:
    """{reason: the message of its first failure}: `known` (the reasons met before, kept as they are)
    followed by each new reason of the (reason, message) `failures` (a falsy reason is no failure, a
    falsy message, or one of line breaks only, is the reason's name). Each message as fit_message
    leaves it: one built by fit_message (every reward, verdict and episode error's is) comes through
    unchanged, anything else is cut the same way. What the user reads to fix it (the console prints
    each reason's once, observe/error_examples.py)."""
    out = dict(known or {})
    for reason, message in failures:
        if reason and reason not in out:
            out[reason] = fit_message("", str(message or "")) or reason  # line breaks only: its name
    return out


def _examples(infos: list[dict[str, Any]], kind: str) -> dict[str, str]:
    """The first message of each reason of `kind` ("reward_error", "verdict_error") in the samples."""
    return first_messages((i.get(kind), i.get(f"{kind}_detail")) for i in infos)


def _baseline_stats(groups: list[Group]) -> dict[str, float]:
    greedy = [g.baseline.reward for g in groups if g.baseline is not None]
    return {"greedy_reward_mean": statistics.fmean(greedy)} if greedy else {}


def _zero_advantage_share(groups: list[Group], rewards: list[float], group_baseline: bool) -> float:
    """The share of groups with nothing to learn from: under a group baseline those whose rewards are all
    equal; under the batch's (or a value head's), all of them when every reward of the batch is equal,
    else none."""
    if group_baseline:
        return sum(1 for g in groups if g.uninformative) / len(groups)
    return float(len(set(rewards)) <= 1)


def _advantage_stats(adv: list[float]) -> dict[str, float]:
    if not adv:
        return {}
    return {
        "advantage_mean": statistics.fmean(adv),
        "advantage_std": statistics.pstdev(adv),
        "advantage_min": min(adv),
        "advantage_max": max(adv),
        "advantage_zero_frac": sum(1 for a in adv if a == 0) / len(adv),
    }
