"""Multi-turn rollouts for env tasks (`task=env:NAME`): episodes in, scored trajectories out.

Both loops start an episode from the single-turn request they would have made (its tag, temperature
and top_p; its max_new_tokens is replaced by the env limits) and score it the same way:
reward = the env's episode reward (sum of step rewards) + reward.format_weight * 1[formatted], where
`formatted` is the env's verdict on the final turn. The colocated loop runs all episodes of a step
with batched `engine.generate` rounds (`run_episodes`); the async worker keeps them in an
EpisodeTable and feeds each turn's follow-up request back to its ContinuousDecoder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamrl.engine.base import GenRequest, GenResult
from streamrl.envs.base import EnvTask
from streamrl.envs.episode import Episode, EpisodeLimits, run_episodes
from streamrl.envs.render import TurnRenderer
from streamrl.rollout.trajectory import RolloutSettings, sample_id
from streamrl.types import Problem, Trajectory


def new_episode(task: EnvTask, renderer: TurnRenderer, problem: Problem, first: GenRequest) -> Episode:
    """A fresh env on `problem`, episode prompt = first.prompt_ids (the rendered chat prompt)."""
    env = task.new_env()
    env.reset(problem)
    e = task.env_cfg
    limits = EpisodeLimits(e.max_turns, e.max_total_tokens, e.max_tokens_per_turn)
    return Episode(env, renderer, list(first.prompt_ids), limits, first.temperature, first.top_p, first.tag)


def episode_trajectory(
    ep: Episode, problem: Problem, settings: RolloutSettings, group_id: str, k: int
) -> Trajectory:
    """The scored Trajectory of a finished episode (sample k of `group_id`; k = GREEDY: the baseline)."""
    formatted = bool(ep.info.get("formatted", False))
    masked = settings.mask_truncated and ep.finish_reason == "length"
    return Trajectory(
        problem_id=problem.id,
        group_id=group_id,
        sample_id=sample_id(group_id, k),
        prompt_ids=ep.prompt_ids,
        completion_ids=ep.completion_ids,
        behaviour_logprobs=ep.logprobs,
        versions=ep.versions,
        finish_reason=ep.finish_reason,
        text=ep.renderer.decode(ep.completion_ids),
        reward=ep.reward + settings.format_weight * formatted,
        correct=bool(ep.info.get("correct", False)),
        reward_info={"extracted": ep.info.get("extracted"), "formatted": formatted, "turns": ep.turns},
        loss_mask=[0] * len(ep.completion_ids) if masked else list(ep.loss_mask),
    )


def rollout_episodes(
    engine: Any,
    tokenizer: Any,
    task: EnvTask,
    settings: RolloutSettings,
    jobs: list[tuple[Problem, GenRequest, str]],
    stop: Callable[[], bool] | None = None,
) -> list[Trajectory]:
    """Colocated: jobs = (problem, first request with tag (_, k), group id) -> trajectories, same order.
    `stop`: asked before each decode step; True raises EvalStopped (envs/episode.py run_episodes)."""
    renderer = TurnRenderer(tokenizer)
    episodes = [new_episode(task, renderer, p, req) for p, req, _ in jobs]
    run_episodes(engine, episodes, stop)
    pairs = zip(episodes, jobs, strict=True)
    return [episode_trajectory(ep, p, settings, gid, req.tag[1]) for ep, (p, req, gid) in pairs]


class EpisodeTable:
    """The async worker's live episodes, keyed by request tag (group id, k)."""

    def __init__(self, task: EnvTask, tokenizer: Any, settings: RolloutSettings) -> None:
        self.task, self.settings = task, settings
        self.renderer = TurnRenderer(tokenizer)
        self.live: dict[Any, tuple[Problem, Episode]] = {}

    def start(self, problem: Problem, first: GenRequest) -> GenRequest:
        ep = new_episode(self.task, self.renderer, problem, first)
        self.live[first.tag] = (problem, ep)
        return ep.request()

    def advance(self, res: GenResult) -> tuple[GenRequest | None, Trajectory | None]:
        """-> (the episode's next request, None) or (None, its finished trajectory)."""
        tag = res.request.tag
        problem, ep = self.live[tag]
        nxt = ep.advance(res)
        if nxt is not None:
            return nxt, None
        del self.live[tag]
        gid, k = tag
        return None, episode_trajectory(ep, problem, self.settings, gid, k)
