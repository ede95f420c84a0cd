"""Greedy accuracy on the held-out problems."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamrl.data.prompts import render_prompt_ids
from streamrl.data.task import Task
from streamrl.engine.base import GenRequest
from streamrl.envs.agent_task import AgentTask
from streamrl.envs.base import EnvTask
from streamrl.eval.stats import wilson_interval
from streamrl.types import EvalStopped, Problem

__all__ = ["EvalResult", "EvalStopped", "evaluate"]


@dataclass
class EvalResult:
    correct: list[bool]
    formatted: list[bool]
    mean_length: float
    seconds: float
    samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / max(len(self.correct), 1)

    def summary(self) -> dict[str, Any]:
        lo, hi = wilson_interval(sum(self.correct), len(self.correct))
        return {
            "accuracy": self.accuracy,
            "n": len(self.correct),
            "correct": sum(self.correct),
            "ci95": [lo, hi],
            "format_rate": sum(self.formatted) / max(len(self.formatted), 1),
            "mean_length": self.mean_length,
            "seconds": self.seconds,
        }


def evaluate(
    engine: Any,
    tokenizer: Any,
    task: Task,
    problems: list[Problem],
    max_new_tokens: int,
    agent_timeout_s: float = 0.0,
    stop: Callable[[], bool] | None = None,
) -> EvalResult:
    """Greedy decoding of every problem, scored by the task. Env tasks run greedy episodes (their
    limits come from the env config; max_new_tokens is not used for them); agent tasks run the agent,
    its calls greedy unless it asks for a temperature (agent_timeout_s: env.agent_timeout_s).
    stop: asked before each of the engine's decode steps (and, for agents, between their calls); True
    raises EvalStopped."""
    if isinstance(task, EnvTask):
        return _evaluate_episodes(engine, tokenizer, task, problems, stop)
    if isinstance(task, AgentTask):
        return _evaluate_agent(engine, tokenizer, task, problems, max_new_tokens, agent_timeout_s, stop)
    start = time.perf_counter()
    reqs = [
        GenRequest(render_prompt_ids(tokenizer, p.messages), max_new_tokens, temperature=0.0)
        for p in problems
    ]
    results = engine.generate(reqs, stop=stop)
    if any(r.finish_reason == "abort" for r in results):
        done = sum(r.finish_reason != "abort" for r in results)
        raise EvalStopped(f"stopped with {done} of {len(reqs)} problems answered")
    correct, formatted, samples = [], [], []
    for p, r in zip(problems, results):
        text = tokenizer.decode(r.token_ids, skip_special_tokens=True)
        s = task.score(p, text)
        correct.append(s.correct)
        formatted.append(s.formatted)
        if len(samples) < 20:
            samples.append({"id": p.id, "answer": p.answer, "response": text, "correct": s.correct})
    mean_len = sum(len(r.token_ids) for r in results) / max(len(results), 1)
    return EvalResult(correct, formatted, mean_len, time.perf_counter() - start, samples)


def _evaluate_agent(
    engine: Any,
    tokenizer: Any,
    task: AgentTask,
    problems: list[Problem],
    max_new_tokens: int,
    timeout_s: float,
    stop: Callable[[], bool] | None,
) -> EvalResult:
    """One agent run per problem through the chat proxy, scored as in training (rollout/agent.py)."""
    from streamrl.rollout.agent import rollout_agent_episodes
    from streamrl.rollout.trajectory import RolloutSettings

    start = time.perf_counter()
    greedy = RolloutSettings(
        samples=1,
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        top_p=1.0,
        # the engine's rows, not one per problem: at most two agents per row run at once (and as many
        # threads and connections), however many problems there are
        max_batch=max(1, min(len(problems), getattr(engine, "max_batch", 64))),
        greedy_baseline=False,
        mask_truncated=False,
        format_weight=0.0,
        agent_timeout_s=timeout_s,
    )
    jobs = [(p, f"eval-{i}", 0) for i, p in enumerate(problems)]
    episodes = rollout_agent_episodes(engine, tokenizer, task, greedy, jobs, stop)
    samples = [
        {"id": p.id, "answer": p.answer, "response": ep.text, "correct": ep.correct}
        for p, ep in list(zip(problems, episodes))[:20]
    ]
    tokens = [sum(len(t.completion_ids) for t in ep.trajectories) for ep in episodes]
    return EvalResult(
        [ep.correct for ep in episodes],
        [ep.formatted for ep in episodes],
        sum(tokens) / max(len(tokens), 1),
        time.perf_counter() - start,
        samples,
    )


def _evaluate_episodes(
    engine: Any, tokenizer: Any, task: EnvTask, problems: list[Problem], stop: Callable[[], bool] | None
) -> EvalResult:
    from streamrl.envs.episode import run_episodes
    from streamrl.envs.render import TurnRenderer
    from streamrl.rollout.episodes import new_episode

    start = time.perf_counter()
    renderer = TurnRenderer(tokenizer)
    episodes = [
        new_episode(task, renderer, p, GenRequest(render_prompt_ids(tokenizer, p.messages), 1, 0.0))
        for p in problems
    ]
    run_episodes(engine, episodes, stop)
    correct = [bool(ep.info.get("correct", False)) for ep in episodes]
    formatted = [bool(ep.info.get("formatted", False)) for ep in episodes]
    samples = [
        {"id": p.id, "answer": p.answer, "response": renderer.decode(ep.completion_ids), "correct": c}
        for p, ep, c in list(zip(problems, episodes, correct))[:20]
    ]
    mean_len = sum(len(ep.completion_ids) for ep in episodes) / max(len(episodes), 1)
    return EvalResult(correct, formatted, mean_len, time.perf_counter() - start, samples)
