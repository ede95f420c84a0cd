"""Agent episodes inside an async rollout worker: a chat proxy per worker, feeding the worker's decoder.

Each worker process serves its own ChatProxy (a free port on 127.0.0.1) whose engine is a
DecoderFront: the calls agents make are queued, and the worker loop adds them to its continuous
decoder between steps, next to everything else it decodes, so agent calls get in-flight weight
updates, per-token versions and partial rollouts like plain groups. For every admitted group the G
agent functions run in their own threads (rollout/agent.py's client: retries with idempotency keys);
each final text goes to the reward service as its episode ends, and when all G are over and scored
(or past reward.step_budget_s) the episodes are assembled into one Group.

    agents.start(group_request)                 # G agent threads
    decoder.add(agents.requests())              # calls made since the last step
    for res in decoder.step():
        if agents.owns(res): agents.resolve(res)  # the waiting call is answered
    for req, group in agents.finished(): ...    # groups whose G episodes all returned (or timed out)

An episode whose agent passes `env.agent_timeout_s` of its own time (rollout/agent.py: `overdue`) is
ended where `finished()` looks; what its thread returns later is dropped.

A group may come to this worker again after it returned it (loop/stall.py sends the groups in flight
again; the copy can cross the result on its way): it is run again, and each run's episodes get names
of their own, `{group}-{k}@{serial}` (serial: this worker's count of groups started). The calls of an
earlier run's agents still running (one ended by its time limit, a thread an agent left behind) are
then refused by the proxy, and what they return is dropped, instead of being taken as the new run's.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from streamrl.engine.base import GenRequest, GenResult
from streamrl.engine.serving import DecoderFront
from streamrl.envs.agent_task import AgentTask
from streamrl.envs.chat_completion import CallRecord
from streamrl.envs.proxy import ChatProxy
from streamrl.rewards.service import RewardOutcome
from streamrl.rollout.agent import (
    TIMEOUT_ERROR,
    AgentRun,
    episode_group,
    overdue,
    run_agent,
    score_episode,
    submit_answer,
)
from streamrl.rollout.score import Scoring
from streamrl.rollout.trajectory import RolloutSettings
from streamrl.types import Group


@dataclass
class Ended:
    """An episode that is over: what its agent returned, its calls, and its final text's score."""

    run: AgentRun
    calls: list[CallRecord]
    score: Future[RewardOutcome]


class AgentGroups:
    def __init__(self, task: AgentTask, tokenizer: Any, settings: RolloutSettings, scoring: Scoring) -> None:
        self.task, self.settings, self.scoring = task, settings, scoring
        self.front = DecoderFront()
        self.proxy = ChatProxy(
            self.front,
            tokenizer,
            max_tokens=settings.max_new_tokens,
            default_temperature=settings.temperature,
            training=True,
            max_context=settings.call_tokens,
        )
        # group -> (its request, the episodes over: their run, calls and score)
        self.open: dict[str, tuple[Any, dict[int, Ended]]] = {}
        self._deadlines: dict[str, float] = {}  # group with all G over -> when its scores run out of budget
        self._returned: queue.SimpleQueue[tuple[str, str, int, AgentRun]] = queue.SimpleQueue()
        self._started: dict[str, float] = {}  # group -> when its agents started (time.monotonic)
        self._names: dict[str, list[str]] = {}  # group -> its episodes' names in the proxy, by k
        self._serial = itertools.count()  # groups started: each run's names are its own

    def start(self, req: Any) -> None:
        """Run the G agent episodes of `req` (a worker GroupRequest), each in its own thread."""
        serial = next(self._serial)
        names = [f"{req.group_id}-{k}@{serial}" for k in range(req.samples)]
        self.open[req.group_id] = (req, {})
        self._started[req.group_id] = time.monotonic()
        self._names[req.group_id] = names
        for k, name in enumerate(names):
            self.proxy.open_episode(name)
            args = (req, k, name)
            threading.Thread(target=self._episode, args=args, name=f"agent-{name}", daemon=True).start()

    def _episode(self, req: Any, k: int, name: str) -> None:
        run = run_agent(self.task, self.proxy.url, name, req.problem.messages)
        self._returned.put((name, req.group_id, k, run))

    @property
    def live(self) -> bool:
        """Some admitted group has episodes still running."""
        return bool(self.open)

    def admitted_versions(self) -> list[int]:
        return [req.admitted_version for req, _ in self.open.values()]

    def requests(self) -> list[GenRequest]:
        """The chat calls made since the last look, for the decoder."""
        return self.front.drain()

    def owns(self, res: GenResult) -> bool:
        return self.front.owns(res)

    def resolve(self, res: GenResult) -> None:
        self.front.resolve(res)

    def finished(self) -> list[tuple[Any, Group]]:
        """Groups whose G episodes have all returned or timed out and been scored (or whose scores ran
        past reward.step_budget_s: reward 0, "step_budget"), assembled."""
        while True:
            try:
                name, gid, k, run = self._returned.get_nowait()
            except queue.Empty:
                break
            # else it was ended earlier, or is of an earlier run of the group: dropped
            if gid in self.open and self._names[gid][k] == name and k not in self.open[gid][1]:
                self._end(gid, k, run)
        now, limit = time.monotonic(), self.settings.agent_timeout_s
        for gid, (req, ended) in list(self.open.items()):
            for k in [k for k in range(req.samples) if k not in ended]:
                late = overdue(self.proxy, self._names[gid][k], self._started[gid], limit, now)
                if late is not None:
                    self._end(gid, k, late)
        out: list[tuple[Any, Group]] = []
        for gid, (req, ended) in list(self.open.items()):
            if len(ended) < req.samples:
                continue
            deadline = self._deadlines.setdefault(gid, self.scoring.deadline())
            if not all(e.score.done() for e in ended.values()) and time.monotonic() < deadline:
                continue
            outcomes = self.scoring.settled([ended[k].score for k in range(req.samples)])
            episodes = [
                score_episode(self.settings, req.problem, gid, k, ended[k].run, ended[k].calls, outcomes[k])
                for k in range(req.samples)
            ]
            del self.open[gid], self._started[gid], self._deadlines[gid], self._names[gid]
            out.append((req, episode_group(req.problem, episodes)))
        return out

    def _end(self, gid: str, k: int, run: AgentRun) -> None:
        """Episode k of group gid is over: its calls are taken and its final text goes to be scored."""
        req, ended = self.open[gid]
        calls = self.proxy.pop_episode(self._names[gid][k], refuse_later=run.error == TIMEOUT_ERROR)
        ended[k] = Ended(run, calls, submit_answer(self.scoring, req.problem, run))

    def close(self) -> None:
        """Fail the calls still waiting (their agents return), then stop the proxy."""
        self.front.close()
        self.proxy.close()
