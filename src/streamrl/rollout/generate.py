"""Sample G responses per problem, score them and return groups of trajectories."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from streamrl.data.prompts import render_prompt_ids
from streamrl.engine.base import Draft, GenRequest, generate
from streamrl.envs.agent_task import AgentTask
from streamrl.envs.base import EnvTask
from streamrl.rollout.score import Scoring
from streamrl.rollout.trajectory import GREEDY, RolloutSettings, greedy_request, make_trajectory
from streamrl.types import EvalStopped, Group, Problem, Trajectory


def rollout_groups(
    engine: Any,
    tokenizer: Any,
    scoring: Scoring,
    problems: list[Problem],
    settings: RolloutSettings,
    step: int,
    first: int = 0,
    drafts: list[tuple[Draft, ...]] | None = None,
    stop: Callable[[], bool] | None = None,
) -> tuple[list[Group], dict[str, float]]:
    """-> (groups, timing). Every problem yields settings.samples trajectories (with screening, those
    whose first settings.screen samples scored alike only those), plus a greedy baseline response per
    group when the advantage estimator needs one (ReMax).
    drafts: per problem, earlier responses its samples verify first (speculative rollouts).
    stop: asked before each of the engine's decode steps (and, for agents, between their calls); True
    ends the generation and raises EvalStopped: nothing of it is returned.

    Group ids are "s{step}-{n}-{problem id}" with n counting the step's groups from `first`: a small
    dataset may hand the same problem out twice in one step, and each draw is its own group."""
    r = settings
    t0 = time.perf_counter()
    gids = [f"s{step}-{first + i}-{p.id}" for i, p in enumerate(problems)]
    if isinstance(scoring.task, AgentTask):  # agents render their own chats (rollout/agent.py)
        return _agent_groups(engine, tokenizer, scoring, problems, gids, settings, t0, stop)
    prompts = [render_prompt_ids(tokenizer, p.messages) for p in problems]
    offered = drafts or [()] * len(problems)

    def sampled(pis: list[int], ks: range) -> list[GenRequest]:
        return [
            GenRequest(
                prompts[pi], r.max_new_tokens, r.temperature, r.top_p, (pi, k), offered[pi], r.spec_lenience
            )
            for pi in pis
            for k in ks
        ]

    everyone = list(range(len(problems)))
    if isinstance(scoring.task, EnvTask):  # multi-turn: the env scores each episode (rollout/episodes.py)
        from streamrl.rollout.episodes import rollout_episodes

        requests = sampled(everyone, range(r.samples))
        requests += [greedy_request(prompts[pi], r, (pi, GREEDY)) for pi in everyone if r.greedy_baseline]
        jobs = [(problems[q.tag[0]], q, gids[q.tag[0]]) for q in requests]
        trajs = rollout_episodes(engine, tokenizer, scoring.task, settings, jobs, stop)
        generate_s = time.perf_counter() - t0
    else:
        # screening (settings.screen): the first samples of every group, then the rest of the groups whose
        # first samples' rewards differ; the others are returned with their first samples only
        screened_k = r.screen or r.samples
        requests = sampled(everyone, range(screened_k))
        requests += [greedy_request(prompts[pi], r, (pi, GREEDY)) for pi in everyone if r.greedy_baseline]
        trajs, generate_s = _generate(engine, tokenizer, scoring, problems, gids, settings, requests, stop)
        if screened_k < r.samples:
            screened = _groups(problems, requests, trajs)
            finish = [pi for pi, g in enumerate(screened) if not g.uninformative]
            more = sampled(finish, range(screened_k, r.samples))
            more_trajs, more_s = _generate(engine, tokenizer, scoring, problems, gids, settings, more, stop)
            requests, trajs, generate_s = requests + more, trajs + more_trajs, generate_s + more_s
    groups = _groups(problems, requests, trajs)
    return groups, {"generate_time": generate_s, "reward_time": time.perf_counter() - t0 - generate_s}


def _generate(
    engine: Any,
    tokenizer: Any,
    scoring: Scoring,
    problems: list[Problem],
    gids: list[str],
    settings: RolloutSettings,
    requests: list[GenRequest],
    stop: Callable[[], bool] | None = None,
) -> tuple[list[Trajectory], float]:
    """Generate and score `requests` (tags (problem index, k)) -> (trajectories in request order, the
    seconds generation took); EvalStopped, before any is scored, if `stop` ended the generation."""
    t0 = time.perf_counter()
    results = generate(engine, requests, stop)  # in request order
    generate_s = time.perf_counter() - t0
    if stop is not None and any(r.finish_reason == "abort" for r in results):
        done = sum(r.finish_reason != "abort" for r in results)
        raise EvalStopped(f"stopped with {done} of {len(requests)} responses sampled")
    trajs = []
    for res in results:
        pi, k = res.request.tag
        trajs.append(make_trajectory(problems[pi], res, tokenizer, settings, gids[pi], k))
    scoring.score([(problems[q.tag[0]], t) for q, t in zip(requests, trajs)])
    return trajs, generate_s


def _groups(problems: list[Problem], requests: list[GenRequest], trajs: list[Trajectory]) -> list[Group]:
    """One group per problem: its samples in request order (that of k), its greedy baseline apart."""
    groups = [Group(problem=p, trajectories=[]) for p in problems]
    for traj, req in zip(trajs, requests, strict=True):
        pi, k = req.tag
        if k == GREEDY:
            groups[pi].baseline = traj
        else:
            groups[pi].trajectories.append(traj)
    return groups


def _agent_groups(
    engine: Any,
    tokenizer: Any,
    scoring: Scoring,
    problems: list[Problem],
    gids: list[str],
    settings: RolloutSettings,
    t0: float,
    stop: Callable[[], bool] | None,
) -> tuple[list[Group], dict[str, float]]:
    from streamrl.rollout.agent import episode_group, rollout_agent_episodes

    G = settings.samples
    jobs = [(p, gids[pi], k) for pi, p in enumerate(problems) for k in range(G)]
    waited = scoring.waited_s
    episodes = rollout_agent_episodes(engine, tokenizer, scoring.task, settings, jobs, stop, scoring)
    reward_s = scoring.waited_s - waited  # the answers' scores, awaited once the episodes were over
    # every group is returned, also one whose agents made no call (its errors are counted; it is not
    # trained: nothing to train on)
    groups = [episode_group(p, episodes[pi * G : (pi + 1) * G]) for pi, p in enumerate(problems)]
    t1 = time.perf_counter()
    return groups, {"generate_time": t1 - t0 - reward_s, "reward_time": reward_s}
