"""One engine result -> one Trajectory, and the greedy baseline request some advantages need."""

from __future__ import annotations

from typing import Any

from streamrl.algo import advantage_spec
from streamrl.config import Config
from streamrl.engine.base import GenRequest, GenResult
from streamrl.types import Problem, Trajectory

GREEDY = -1  # the sample index of a group's greedy baseline response


def sample_id(group_id: str, k: int) -> str:
    return f"{group_id}-{'greedy' if k == GREEDY else k}"


def needs_greedy_baseline(cfg: Config) -> bool:
    return advantage_spec(cfg.advantage.name).greedy_baseline


def greedy_request(prompt_ids: list[int], cfg: Config, tag: Any) -> GenRequest:
    """ReMax's baseline: the temperature-0 response to the prompt, scored like the samples."""
    return GenRequest(prompt_ids, cfg.rollout.max_new_tokens, 0.0, 1.0, tag=tag)


def make_trajectory(
    problem: Problem, res: GenResult, tokenizer: Any, cfg: Config, group_id: str, k: int
) -> Trajectory:
    """An unscored trajectory from one engine result (sample k of group `group_id`; k = GREEDY for the
    greedy baseline). Scoring (rollout/score.py) fills reward, correct and reward_info."""
    masked = cfg.loss.mask_truncated and res.finish_reason == "length"
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
    )
