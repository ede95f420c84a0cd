"""Sample G responses per problem, score them and return groups of trajectories."""

from __future__ import annotations

import time
from typing import Any

from streamrl.config import Config
from streamrl.data.prompts import render_prompt_ids
from streamrl.engine.base import GenRequest, GenResult
from streamrl.envs.agent_task import AgentTask
from streamrl.envs.base import EnvTask
from streamrl.rewards.scoring import Scoring
from streamrl.types import Group, Problem, Trajectory

GREEDY = -1  # the sample index of a group's greedy baseline response


def rollout_groups(
    engine: Any,
    tokenizer: Any,
    scoring: Scoring,
    problems: list[Problem],
    cfg: Config,
    step: int,
    first: int = 0,
) -> tuple[list[Group], dict[str, float]]:
    """-> (groups, timing). Every problem yields exactly cfg.rollout.samples_per_prompt trajectories,
    plus a greedy baseline response per group when the advantage estimator needs one (ReMax).

    Group ids are "s{step}-{n}-{problem id}" with n counting the step's groups from `first`: a small
    dataset may hand the same problem out twice in one step, and each draw is its own group."""
    r = cfg.rollout
    t0 = time.perf_counter()
    gids = [f"s{step}-{first + i}-{p.id}" for i, p in enumerate(problems)]
    if isinstance(scoring.task, AgentTask):  # agents render their own chats (runtime/agent_rollout.py)
        return _agent_groups(engine, tokenizer, scoring.task, problems, gids, cfg, t0)
    prompts = [render_prompt_ids(tokenizer, p.messages) for p in problems]
    requests = [
        GenRequest(ids, r.max_new_tokens, r.temperature, r.top_p, tag=(pi, k))
        for pi, ids in enumerate(prompts)
        for k in range(r.samples_per_prompt)
    ]
    if needs_greedy_baseline(cfg):
        requests += [greedy_request(ids, cfg, (pi, GREEDY)) for pi, ids in enumerate(prompts)]
    if isinstance(scoring.task, EnvTask):  # multi-turn: the env scores each episode (runtime/episodes.py)
        from streamrl.runtime.episodes import rollout_episodes

        jobs = [(problems[q.tag[0]], q, gids[q.tag[0]]) for q in requests]
        trajs = rollout_episodes(engine, tokenizer, scoring.task, cfg, jobs)
        t1 = time.perf_counter()
    else:
        results = engine.generate(requests)  # in request order
        t1 = time.perf_counter()
        trajs = []
        for res in results:
            pi, k = res.request.tag
            trajs.append(make_trajectory(problems[pi], res, tokenizer, cfg, gids[pi], k))
        scoring.score([(problems[q.tag[0]], t) for q, t in zip(requests, trajs)])
    groups = [Group(problem=p, trajectories=[]) for p in problems]
    for traj, req in zip(trajs, requests, strict=True):
        pi, k = req.tag
        if k == GREEDY:
            groups[pi].baseline = traj
        else:
            groups[pi].trajectories.append(traj)
    t2 = time.perf_counter()
    return groups, {"generate_time": t1 - t0, "reward_time": t2 - t1}


def _agent_groups(
    engine: Any, tokenizer: Any, task: Any, problems: list[Problem], gids: list[str], cfg: Config, t0: float
) -> tuple[list[Group], dict[str, float]]:
    from streamrl.runtime.agent_rollout import rollout_agent_episodes

    G = cfg.rollout.samples_per_prompt
    jobs = [(p, gids[pi], k) for pi, p in enumerate(problems) for k in range(G)]
    episodes = rollout_agent_episodes(engine, tokenizer, task, cfg, jobs)
    groups = []
    for pi, p in enumerate(problems):
        eps = episodes[pi * G : (pi + 1) * G]
        trajs = [t for _, ep in eps for t in ep]
        if trajs:  # agents that made no call leave nothing to train on
            groups.append(Group(problem=p, trajectories=trajs, episode_rewards=[r for r, _ in eps]))
    t1 = time.perf_counter()
    return groups, {"generate_time": t1 - t0, "reward_time": 0.0}


def needs_greedy_baseline(cfg: Config) -> bool:
    from streamrl.algo import advantage_spec

    return advantage_spec(cfg.advantage.name).greedy_baseline


def greedy_request(prompt_ids: list[int], cfg: Config, tag: Any) -> GenRequest:
    """ReMax's baseline: the temperature-0 response to the prompt, scored like the samples."""
    return GenRequest(prompt_ids, cfg.rollout.max_new_tokens, 0.0, 1.0, tag=tag)


def make_trajectory(
    problem: Problem, res: GenResult, tokenizer: Any, cfg: Config, group_id: str, k: int
) -> Trajectory:
    """An unscored trajectory from one engine result (sample k of group `group_id`; k = GREEDY for the
    greedy baseline). Scoring (rewards/scoring.py) fills reward, correct and reward_info."""
    masked = cfg.loss.mask_truncated and res.finish_reason == "length"
    return Trajectory(
        problem_id=problem.id,
        group_id=group_id,
        sample_id=f"{group_id}-{'greedy' if k == GREEDY else k}",
        prompt_ids=res.request.prompt_ids,
        completion_ids=res.token_ids,
        behaviour_logprobs=res.logprobs,
        versions=res.versions,
        finish_reason=res.finish_reason,
        text=tokenizer.decode(res.token_ids, skip_special_tokens=True),
        loss_mask=[0] * len(res.token_ids) if masked else [],
    )
