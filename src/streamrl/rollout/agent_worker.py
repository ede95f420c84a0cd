"""Agent episodes inside an async rollout worker: a chat proxy per worker, feeding the worker's decoder.

Each worker process serves its own ChatProxy (a free port on 127.0.0.1) whose engine is a
DecoderFront: the calls agents make are queued, and the worker loop adds them to its continuous
decoder between steps, next to everything else it decodes, so agent calls get in-flight weight
updates, per-token versions and partial rollouts like plain groups. For every admitted group the G
agent functions run in their own threads (rollout/agent.py's client: retries with idempotency keys);
when all G have returned, the episodes are scored and assembled into one Group.

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
from typing import Any

from streamrl.engine.base import GenRequest, GenResult
from streamrl.engine.serving import DecoderFront
from streamrl.envs.agent_task import AgentTask
from streamrl.envs.proxy import ChatProxy
from streamrl.rollout.agent import (
    TIMEOUT_ERROR,
    AgentEpisode,
    AgentRun,
    episode_group,
    overdue,
    run_agent,
    score_episode,
)
from streamrl.rollout.trajectory import RolloutSettings
from streamrl.types import Group


class AgentGroups:
    def __init__(self, task: AgentTask, tokenizer: Any, settings: RolloutSettings) -> None:
        self.task, self.settings = task, settings
        self.front = DecoderFront()
        self.proxy = ChatProxy(
            self.front,
            tokenizer,
            max_tokens=settings.max_new_tokens,
            default_temperature=settings.temperature,
            training=True,
            max_context=settings.call_tokens,
        )
        self.open: dict[str, tuple[Any, dict[int, AgentEpisode]]] = {}
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
        """Groups whose G episodes have all returned or timed out, scored and assembled."""
        out: list[tuple[Any, Group]] = []
        while True:
            try:
                name, gid, k, run = self._returned.get_nowait()
            except queue.Empty:
                break
            # else it was ended earlier, or is of an earlier run of the group: dropped
            if gid in self.open and self._names[gid][k] == name and k not in self.open[gid][1]:
                self._settle(gid, k, run, out)
        now, limit = time.monotonic(), self.settings.agent_timeout_s
        for gid, (req, episodes) in list(self.open.items()):
            for k in [k for k in range(req.samples) if k not in episodes]:
                late = overdue(self.proxy, self._names[gid][k], self._started[gid], limit, now)
                if late is not None:
                    self._settle(gid, k, late, out)
        return out

    def _settle(self, gid: str, k: int, run: AgentRun, out: list[tuple[Any, Group]]) -> None:
        """Episode k of group gid is over: score it; a group with all G over goes to `out`."""
        req, episodes = self.open[gid]
        calls = self.proxy.pop_episode(self._names[gid][k], refuse_later=run.error == TIMEOUT_ERROR)
        episodes[k] = score_episode(self.task, self.settings, req.problem, gid, k, run, calls)
        if len(episodes) == req.samples:
            del self.open[gid], self._started[gid], self._names[gid]
            out.append((req, episode_group(req.problem, [episodes[i] for i in range(req.samples)])))

    def close(self) -> None:
        """Fail the calls still waiting (their agents return), then stop the proxy."""
        self.front.close()
        self.proxy.close()
