"""What producing rollouts needs to know (RolloutSettings), one engine result -> one Trajectory, and the
greedy baseline request some advantages need."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamrl.algo import advantage_spec
from streamrl.config import Config
from streamrl.engine.base import GenRequest, GenResult
from streamrl.types import Problem, Trajectory

GREEDY = -1  # the sample index of a group's greedy baseline response


def sample_id(group_id: str, k: int) -> str:
    return f"{group_id}-{'greedy' if k == GREEDY else k}"


@dataclass(frozen=True)
class RolloutSettings:
    """The settings every rollout producer reads, taken once from a run's config sections."""

    samples: int  # G: samples per prompt
    max_new_tokens: int
    temperature: float
    top_p: float
    max_batch: int  # rows an engine decodes at once
    greedy_baseline: bool  # also decode each prompt greedily (the advantage needs it: ReMax)
    mask_truncated: bool  # responses cut at max_new_tokens get loss mask 0 (loss.mask_truncated)
    format_weight: float  # reward bonus for following the answer format (reward.format_weight)
    spec_lenience: float = 0.0  # speculative rollouts: 0 exact verification, > 0 SPEC-RL's lenient rule
    # screening: a group's first `screen` samples are drawn and scored first, the rest only if their
    # rewards differ (0: the whole group at once); validated: dynamic sampling on, single-turn tasks
    screen: int = 0
    agent_timeout_s: float = 0.0  # task=agent: an agent's own seconds (outside model calls); 0 = none
    # task=agent: a call's prompt + completion tokens at most (train.token_budget: a trajectory is its
    # last call's prompt and completion, so it fits one trainer micro-batch); 0 = no bound
    call_tokens: int = 0

    @classmethod
    def from_config(cls, cfg: Config) -> RolloutSettings:
        r = cfg.rollout
        return cls(
            samples=r.samples_per_prompt,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            max_batch=r.max_batch,
            greedy_baseline=advantage_spec(cfg.advantage.name).greedy_baseline,
            mask_truncated=cfg.loss.mask_truncated,
            format_weight=cfg.reward.format_weight,
            spec_lenience=r.spec_lenience,
            screen=r.screen_samples,
            agent_timeout_s=cfg.env.agent_timeout_s,
            call_tokens=cfg.train.token_budget,
        )


def greedy_request(prompt_ids: list[int], settings: RolloutSettings, tag: Any) -> GenRequest:
    """ReMax's baseline: the temperature-0 response to the prompt, scored like the samples."""
    return GenRequest(prompt_ids, settings.max_new_tokens, 0.0, 1.0, tag=tag)


def make_trajectory(
    problem: Problem, res: GenResult, tokenizer: Any, settings: RolloutSettings, group_id: str, k: int
) -> Trajectory:
    """An unscored trajectory from one engine result (sample k of group `group_id`; k = GREEDY for the
    greedy baseline). Scoring (rollout/score.py) fills reward, correct and reward_info."""
    masked = settings.mask_truncated and res.finish_reason == "length"
    return Trajectory(
        problem_id=problem.id,
        group_id=group_id,
        sample_id=sample_id(group_id, k),
        prompt_ids=res.request.prompt_ids,
        completion_ids=res.token_ids,
        behaviour_logprobs=res.logprobs,
        versions=res.versions,
        finish_reason=res.finish_reason,
        text=tokenizer.decode(res.token_ids, skip_special_tokens=True),
        loss_mask=[0] * len(res.token_ids) if masked else [],
        drafted=res.request.offers_drafts,
        draft_tokens=res.draft_tokens,
        draft_accepted=res.draft_accepted,
        tree_tokens=res.tree_tokens,
        policy_logprobs=res.policy_logprobs + res.logprobs[len(res.policy_logprobs) :]
        if res.policy_logprobs
        else [],
    )
