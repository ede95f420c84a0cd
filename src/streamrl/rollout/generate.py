"""Sample G responses per problem, score them and return groups of trajectories."""

from __future__ import annotations

import time
from typing import Any

from streamrl.data.prompts import render_prompt_ids
from streamrl.engine.base import Draft, GenRequest
from streamrl.envs.agent_task import AgentTask
from streamrl.envs.base import EnvTask
from streamrl.rollout.score import Scoring
from streamrl.rollout.trajectory import GREEDY, RolloutSettings, greedy_request, make_trajectory
from streamrl.types import Group, Problem


def rollout_groups(
    engine: Any,
    tokenizer: Any,
    scoring: Scoring,
    problems: list[Problem],
    settings: RolloutSettings,
    step: int,
    first: int = 0,
    drafts: list[tuple[Draft, ...]] | None = None,
) -> tuple[list[Group], dict[str, float]]:
    """-> (groups, timing). Every problem yields exactly settings.samples trajectories,
    plus a greedy baseline response per group when the advantage estimator needs one (ReMax).
    drafts: per problem, earlier responses its samples verify first (speculative rollouts).

    Group ids are "s{step}-{n}-{problem id}" with n counting the step's groups from `first`: a small
    dataset may hand the same problem out twice in one step, and each draw is its own group."""
    r = settings
    t0 = time.perf_counter()
    gids = [f"s{step}-{first + i}-{p.id}" for i, p in enumerate(problems)]
    if isinstance(scoring.task, AgentTask):  # agents render their own chats (rollout/agent.py)
        return _agent_groups(engine, tokenizer, scoring.task, problems, gids, settings, t0)
    prompts = [render_prompt_ids(tokenizer, p.messages) for p in problems]
    offered = drafts or [()] * len(problems)
    requests = [
        GenRequest(ids, r.max_new_tokens, r.temperature, r.top_p, (pi, k), offered[pi], r.spec_lenience)
        for pi, ids in enumerate(prompts)
        for k in range(r.samples)
    ]
    if r.greedy_baseline:
        requests += [greedy_request(ids, r, (pi, GREEDY)) for pi, ids in enumerate(prompts)]
    if isinstance(scoring.task, EnvTask):  # multi-turn: the env scores each episode (rollout/episodes.py)
        from streamrl.rollout.episodes import rollout_episodes

        jobs = [(problems[q.tag[0]], q, gids[q.tag[0]]) for q in requests]
        trajs = rollout_episodes(engine, tokenizer, scoring.task, settings, jobs)
        t1 = time.perf_counter()
    else:
        results = engine.generate(requests)  # in request order
        t1 = time.perf_counter()
        trajs = []
        for res in results:
            pi, k = res.request.tag
            trajs.append(make_trajectory(problems[pi], res, tokenizer, settings, gids[pi], k))
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
    engine: Any,
    tokenizer: Any,
    task: Any,
    problems: list[Problem],
    gids: list[str],
    settings: RolloutSettings,
    t0: float,
) -> tuple[list[Group], dict[str, float]]:
    from streamrl.rollout.agent import episode_group, rollout_agent_episodes

    G = settings.samples
    jobs = [(p, gids[pi], k) for pi, p in enumerate(problems) for k in range(G)]
    episodes = rollout_agent_episodes(engine, tokenizer, task, settings, jobs)
    # every group is returned, also one whose agents made no call (its errors are counted; it is not
    # trained: nothing to train on)
    groups = [episode_group(p, episodes[pi * G : (pi + 1) * G]) for pi, p in enumerate(problems)]
    t1 = time.perf_counter()
    return groups, {"generate_time": t1 - t0, "reward_time": 0.0}
