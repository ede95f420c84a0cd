"""Colocated rollouts of `task=agent:...`: run G agent episodes per problem against the chat proxy.

Each episode runs in its own thread with an `openai.OpenAI` client whose API key is the episode id;
the proxy batches the concurrent calls of all episodes through one engine. When every episode has
returned, its calls are assembled into trajectories (one per unbroken context, see
envs/agent_trajectory.py), each tagged with its episode index in reward_info["episode"] so advantages
are computed per episode (loop/step.py). An agent that raises costs its episode: reward 0,
reason in reward_info["agent_error"], and the calls it made are still trained on.
"""

from __future__ import annotations

import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from streamrl.engine.serving import BatchingEngine
from streamrl.envs.agent_task import AgentTask
from streamrl.envs.agent_trajectory import assemble
from streamrl.envs.proxy import ChatProxy
from streamrl.rollout.trajectory import RolloutSettings
from streamrl.types import Problem, Trajectory


def run_agent(
    task: AgentTask, base_url: str, episode: str, messages: list[dict[str, str]]
) -> tuple[str, str]:
    """-> (final text, error). The agent's own exceptions are caught: they cost only its episode."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=episode, max_retries=0, timeout=600)
    try:
        return str(task.agent(client, [dict(m) for m in messages]) or ""), ""
    except Exception as e:
        return "", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
    finally:
        client.close()


def rollout_agent_episodes(
    engine: Any,
    tokenizer: Any,
    task: AgentTask,
    settings: RolloutSettings,
    jobs: list[tuple[Problem, str, int]],
) -> list[tuple[float, list[Trajectory]]]:
    """jobs: (problem, group_id, sample index k) -> (reward, trajectories) of each episode, in job order."""
    r = settings
    front = BatchingEngine(engine, max_batch=r.max_batch)
    proxy = ChatProxy(front, tokenizer, max_tokens=r.max_new_tokens, default_temperature=r.temperature)
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            futures = [
                pool.submit(run_agent, task, proxy.url, f"{gid}-{k}", problem.messages)
                for problem, gid, k in jobs
            ]
            outputs = [f.result() for f in futures]
        episodes = []
        for (problem, gid, k), (text, error) in zip(jobs, outputs):
            calls = proxy.pop_episode(f"{gid}-{k}")
            s = task.score(problem, text)
            reward = float(s.correct) + settings.format_weight * float(s.formatted) if not error else 0.0
            trajs = assemble(calls, problem.id, gid, k, reward, s.correct and not error)
            info = {"episode": k, "extracted": s.extracted, "formatted": s.formatted, "calls": len(calls)}
            if error:
                info["agent_error"] = error
            for t in trajs:
                t.reward_info = dict(info)
            episodes.append((reward, trajs))
        return episodes
    finally:
        proxy.close()
        front.close()
