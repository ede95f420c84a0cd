"""Rollouts of `task=agent:...`: run agent episodes against the chat proxy and score them.

Each episode runs in its own thread with an `openai.OpenAI` client whose API key is the episode id.
The client retries failed calls (connection resets, 5xx) with an idempotency key kept across the
retries of one call, so the proxy generates and records a retried call once (envs/proxy.py). When an
episode returns, its calls are assembled into trajectories (one per unbroken context, see
envs/agent_trajectory.py), each tagged with its episode index in reward_info["episode"] so advantages
are computed per episode (loop/step.py). An agent that raises costs its episode: reward 0, reason
(the exception's type) in the group's episode_errors and reward_info["agent_error"] with the message;
the calls it made are still trained on. So does an agent whose own time (outside its model calls: its
code and tools) passes `env.agent_timeout_s`: its episode ends as EpisodeTimeout, the proxy refuses its
later calls, and its thread is left to finish on its own (threads cannot be killed; it is a daemon).
Time inside model calls is not counted: under load those queue in the engine, and every generation
ends by its token limit. The colocated loop runs all episodes of a step here
(`rollout_agent_episodes`), at most AGENTS_PER_ROW x rollout.max_batch at once (a held-out evaluation
of thousands of problems starts the next agent as one ends, not thousands of threads and connections);
the async worker runs them through rollout/agent_worker.py.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from streamrl.engine.serving import BatchingEngine
from streamrl.envs.agent_task import AgentTask
from streamrl.envs.agent_trajectory import assemble
from streamrl.envs.chat_completion import CallRecord
from streamrl.envs.proxy import CALL_ID_HEADER, ChatProxy
from streamrl.observe.error_examples import fit_message
from streamrl.rewards.service import RewardOutcome
from streamrl.rollout.score import Scoring, error_message, outcome_reward
from streamrl.rollout.trajectory import RolloutSettings
from streamrl.types import EvalStopped, Group, Problem, Trajectory

CLIENT_RETRIES = 4  # per call, with the client's exponential backoff; safe: retried calls are idempotent
CLIENT_TIMEOUT_S = 600.0
TIMEOUT_ERROR = "EpisodeTimeout"
POLL_S = 0.05  # how often the colocated loop looks for episodes past their time limit
# agents running at once per engine row (rollout.max_batch): while some run their own code and tools,
# the others' calls fill the batch; the rest start as agents end
AGENTS_PER_ROW = 2


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
    correct: bool = False  # the base task's verdict on the final text (False when the agent failed)
    formatted: bool = False
    text: str = ""  # the agent's final answer
    detail: str = ""  # the error's message ("" when the agent returned)


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
    """The agent's own exceptions are caught: they cost only its episode. SystemExit too (a tool that
    calls sys.exit): a thread would end on it without a word, and its episode would never return."""
    client = agent_client(base_url, episode)
    try:
        return AgentRun(str(task.agent(client, [dict(m) for m in messages]) or ""))
    except BaseException as e:
        return AgentRun("", type(e).__name__, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
    finally:
        client.close()


def overdue(proxy: ChatProxy, episode: str, started: float, limit: float, now: float) -> AgentRun | None:
    """The run that ends an episode whose agent has spent over `limit` seconds (time.monotonic) of its
    own since `started`, i.e. outside its model calls; None within it or with no limit (0)."""
    if limit <= 0:
        return None
    own = now - started - proxy.model_seconds(episode, now)
    if own <= limit:
        return None
    detail = (
        f"{TIMEOUT_ERROR}: the agent ran {own:.0f} s outside its model calls, over env.agent_timeout_s="
        f"{limit:g}; the episode was ended and its calls so far are trained on"
    )
    return AgentRun("", TIMEOUT_ERROR, detail)


def inline_outcome(task: AgentTask, settings: RolloutSettings, problem: Problem, text: str) -> RewardOutcome:
    """The base task's score of a final text, computed here (held-out evaluation scores inline, as it
    does plain responses); training scores through the reward service (Scoring.submit_text)."""
    reward, correct, facts = outcome_reward(task, problem, text, settings.format_weight)
    return RewardOutcome(reward, {**facts, "correct": correct})


def submit_answer(scoring: Scoring, problem: Problem, run: AgentRun) -> Future[RewardOutcome]:
    """The final text's score from the reward service; an agent that failed has nothing to score."""
    if run.error:
        done: Future[RewardOutcome] = Future()
        done.set_result(RewardOutcome(0.0, {"correct": False, "formatted": False}))
        return done
    return scoring.submit_text(problem, run.text)


def score_episode(
    settings: RolloutSettings,
    problem: Problem,
    group_id: str,
    k: int,
    run: AgentRun,
    calls: list[CallRecord],
    outcome: RewardOutcome,
) -> AgentEpisode:
    """Reward = the base task's score of the final text (outcome: its partial credit where it gives one,
    plus the format bonus; 0 if the agent raised or the scoring failed), on every trajectory."""
    ok = not run.error  # a failed score is reward 0, neither correct nor formatted (rewards/service.py)
    reward = outcome.reward if ok else 0.0
    correct, formatted = bool(outcome.info.get("correct")) and ok, bool(outcome.info.get("formatted")) and ok
    trajs = assemble(calls, problem.id, group_id, k, reward, correct, settings.mask_truncated)
    facts = {"extracted": outcome.info.get("extracted"), "formatted": bool(outcome.info.get("formatted"))}
    info = {"episode": k, **facts, "calls": len(calls)}
    if run.error:
        info["agent_error"] = run.detail
    if outcome.error is not None:  # a scorer past reward.timeout_s or the step's budget, or one that raised
        detail, fn = outcome.info.get("error_detail"), outcome.info.get("reward_fn")
        info["reward_error_detail"] = error_message(outcome.error, detail, fn=fn, problem=problem.id)
    for t in trajs:
        t.reward_info = dict(info)
    if trajs and not run.error:  # how scoring went, once per episode the service scored (the step's
        # rewards_scored, reward_errors and latency count episodes)
        scored = {"reward_error": outcome.error, "reward_latency_s": outcome.latency_s}
        trajs[0].reward_info.update(scored, reward_cached=outcome.cached)
    # the first line of the error's detail reads "Type: message" already
    first = (run.detail.splitlines() or [run.error])[0]
    detail = fit_message("", first, f" (problem {problem.id})") if run.error else ""
    return AgentEpisode(reward, trajs, run.error, correct, formatted, run.text, detail)


def episode_group(problem: Problem, episodes: list[AgentEpisode]) -> Group:
    """The group of a problem's G episodes (it may hold no trajectory if no agent made a call)."""
    return Group(
        problem=problem,
        trajectories=[t for ep in episodes for t in ep.trajectories],
        episode_rewards=[ep.reward for ep in episodes],
        episode_errors=[ep.error for ep in episodes],
        episode_error_details=[ep.detail for ep in episodes],
        episode_correct=[ep.correct for ep in episodes],
        episode_formatted=[ep.formatted for ep in episodes],
    )


def rollout_agent_episodes(
    engine: Any,
    tokenizer: Any,
    task: AgentTask,
    settings: RolloutSettings,
    jobs: list[tuple[Problem, str, int]],
    stop: Callable[[], bool] | None = None,
    scoring: Scoring | None = None,
) -> list[AgentEpisode]:
    """Colocated: jobs = (problem, group_id, sample index k) -> each episode, in job order. `stop`
    (evaluation, a colocated step's rollouts) is asked before each decode step and between polls: once
    it says True, the agents still running are cut off (the proxy closes) and EvalStopped is raised.
    `scoring` (training): each final text goes to the reward service as its episode ends, bounded by
    reward.timeout_s and the step's budget, and the calls sample at settings.temperature with top_p 1,
    whatever they ask (envs/proxy.py); without it (evaluation) the texts are scored here at the end."""
    r = settings
    front = BatchingEngine(engine, max_batch=r.max_batch, stop=stop)
    proxy = ChatProxy(
        front,
        tokenizer,
        max_tokens=r.max_new_tokens,
        default_temperature=r.temperature,
        training=scoring is not None,
        max_context=r.call_tokens,
    )
    returned: queue.SimpleQueue[tuple[int, AgentRun]] = queue.SimpleQueue()

    def episode(i: int, messages: list[dict[str, str]], name: str) -> None:
        returned.put((i, run_agent(task, proxy.url, name, messages)))

    names = [f"{gid}-{k}" for _, gid, k in jobs]
    runs: dict[int, tuple[AgentRun, list[CallRecord]]] = {}  # the episodes over, with their calls
    running: dict[int, float] = {}  # the episodes started and not over -> their start (time.monotonic)
    started = 0  # jobs started, in job order
    at_once = AGENTS_PER_ROW * max(1, r.max_batch)

    scores: dict[int, Future[RewardOutcome]] = {}

    def over(i: int, run: AgentRun, calls: list[CallRecord]) -> None:
        runs[i] = (run, calls)
        if scoring is not None:  # scored while the other episodes go on
            scores[i] = submit_answer(scoring, jobs[i][0], run)

    def start() -> None:  # daemons: an agent past its limit is left behind
        nonlocal started
        while started < len(jobs) and len(running) < at_once:
            i, started = started, started + 1
            running[i] = time.monotonic()
            proxy.open_episode(names[i])  # served from now until popped: other names are refused
            threading.Thread(target=episode, args=(i, jobs[i][0].messages, names[i]), daemon=True).start()

    try:
        start()
        while len(runs) < len(jobs):
            if stop is not None and stop():
                raise EvalStopped(f"stopped with {len(runs)} of {len(jobs)} agent runs over")
            try:
                i, run = returned.get(timeout=POLL_S)
                if running.pop(i, None) is not None:  # else it was ended earlier: what it returns is dropped
                    over(i, run, proxy.pop_episode(names[i]))
            except queue.Empty:
                pass
            now = time.monotonic()
            for i, t0 in list(running.items()):
                if late := overdue(proxy, names[i], t0, r.agent_timeout_s, now):
                    del running[i]
                    over(i, late, proxy.pop_episode(names[i], refuse_later=True))  # ended now, refused on
            start()
        # a call the stop aborted reaches its agent as an empty reply: the run ended, but not as it would
        cut = sum(any(c.finish_reason == "abort" for c in calls) for _, calls in runs.values())
        if stop is not None and cut:
            ended = len(jobs) - cut
            raise EvalStopped(f"stopped with {ended} of {len(jobs)} agent runs over ({cut} cut short)")
        if scoring is not None:
            outcomes = scoring.outcomes([scores[i] for i in range(len(jobs))])
        else:
            texts = [runs[i][0].text for i in range(len(jobs))]
            outcomes = [inline_outcome(task, settings, p, t) for (p, _, _), t in zip(jobs, texts)]
        return [
            score_episode(settings, problem, gid, k, *runs[i], outcomes[i])
            for i, (problem, gid, k) in enumerate(jobs)
        ]
    finally:
        proxy.close()
        front.close()
