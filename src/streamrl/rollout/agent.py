"""Rollouts of `task=agent:...`: run agent episodes against the chat proxy and score them.

Each episode runs in its own thread with an `openai.OpenAI` client whose API key is the episode id.
The client retries failed calls (connection resets, 5xx) with an idempotency key kept across the
retries of one call, so the proxy generates and records a retried call once (envs/proxy.py). When an
episode returns, its calls are assembled into trajectories (one per unbroken context, see
envs/agent_trajectory.py), each tagged with its episode index in reward_info["episode"] so advantages
are computed per episode (loop/step.py). An agent that raises costs its episode: reward 0, reason
(the exception's type) in the group's episode_errors and reward_info["agent_error"] with the message;
the calls it made are still trained on. The colocated loop runs all episodes of a step here
(`rollout_agent_episodes`); the async worker runs them through rollout/agent_worker.py.
"""

from __future__ import annotations

import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from streamrl.engine.serving import BatchingEngine
from streamrl.envs.agent_task import AgentTask
from streamrl.envs.agent_trajectory import assemble
from streamrl.envs.chat_completion import CallRecord
from streamrl.envs.proxy import CALL_ID_HEADER, ChatProxy
from streamrl.rollout.trajectory import RolloutSettings
from streamrl.types import Group, Problem, Trajectory

CLIENT_RETRIES = 4  # per call, with the client's exponential backoff; safe: retried calls are idempotent
CLIENT_TIMEOUT_S = 600.0


@dataclass
class AgentRun:
    """What an agent function returned: its final text, or the error that ended it."""

    text: str
    error: str = ""  # the exception's type name; "" when the agent returned
    detail: str = ""  # message and the end of the traceback


@dataclass
class AgentEpisode:
    reward: float
    trajectories: list[Trajectory]
    error: str


def agent_client(base_url: str, episode: str) -> Any:
    """The client an agent gets: its API key names the episode; each call carries an idempotency key
    (generated once per call, resent on its retries), so a retry never generates or records twice."""
    import openai

    client = openai.OpenAI(
        base_url=base_url, api_key=episode, max_retries=CLIENT_RETRIES, timeout=CLIENT_TIMEOUT_S
    )
    client._idempotency_header = CALL_ID_HEADER  # the SDK's own per-call key, reused across retries
    return client


def run_agent(task: AgentTask, base_url: str, episode: str, messages: list[dict[str, str]]) -> AgentRun:
    """The agent's own exceptions are caught: they cost only its episode."""
    client = agent_client(base_url, episode)
    try:
        return AgentRun(str(task.agent(client, [dict(m) for m in messages]) or ""))
    except Exception as e:
        return AgentRun("", type(e).__name__, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
    finally:
        client.close()


def score_episode(
    task: AgentTask,
    settings: RolloutSettings,
    problem: Problem,
    group_id: str,
    k: int,
    run: AgentRun,
    calls: list[CallRecord],
) -> AgentEpisode:
    """Reward = the base task's score of the final text (0 if the agent raised), on every trajectory."""
    s = task.score(problem, run.text)
    reward = float(s.correct) + settings.format_weight * float(s.formatted) if not run.error else 0.0
    trajs = assemble(calls, problem.id, group_id, k, reward, s.correct and not run.error)
    info = {"episode": k, "extracted": s.extracted, "formatted": s.formatted, "calls": len(calls)}
    if run.error:
        info["agent_error"] = run.detail
    for t in trajs:
        t.reward_info = dict(info)
    return AgentEpisode(reward, trajs, run.error)


def episode_group(problem: Problem, episodes: list[AgentEpisode]) -> Group:
    """The group of a problem's G episodes (it may hold no trajectory if no agent made a call)."""
    return Group(
        problem=problem,
        trajectories=[t for ep in episodes for t in ep.trajectories],
        episode_rewards=[ep.reward for ep in episodes],
        episode_errors=[ep.error for ep in episodes],
    )


def rollout_agent_episodes(
    engine: Any,
    tokenizer: Any,
    task: AgentTask,
    settings: RolloutSettings,
    jobs: list[tuple[Problem, str, int]],
) -> list[AgentEpisode]:
    """Colocated: jobs = (problem, group_id, sample index k) -> each episode, in job order."""
    r = settings
    front = BatchingEngine(engine, max_batch=r.max_batch)
    proxy = ChatProxy(front, tokenizer, max_tokens=r.max_new_tokens, default_temperature=r.temperature)
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            futures = [
                pool.submit(run_agent, task, proxy.url, f"{gid}-{k}", problem.messages)
                for problem, gid, k in jobs
            ]
            runs = [f.result() for f in futures]
        return [
            score_episode(task, settings, problem, gid, k, run, proxy.pop_episode(f"{gid}-{k}"))
            for (problem, gid, k), run in zip(jobs, runs)
        ]
    finally:
        proxy.close()
        front.close()
