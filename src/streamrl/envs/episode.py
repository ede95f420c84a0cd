"""One multi-turn episode as a small state machine, token-in-token-out.

Usable by any driver that can run a GenRequest: the colocated rollout batches the next turns of all
live episodes into one `engine.generate`; the async worker feeds them to its ContinuousDecoder.

    req = episode.request()
    while req is not None:
        req = episode.advance(run(req))          # -> the next turn's request, or None when finished

Layout of the finished episode (C = len(completion_ids)):
    completion_ids     = turn_1 + obs_1 + turn_2 + obs_2 + ... + turn_n          [C]
    loss_mask          = 1 on turn tokens, 0 on observation tokens                [C]
    behaviour_logprobs = the engine's log-probs on turn tokens, 0.0 on observations [C]
    versions           = the engine's versions on turn tokens; an observation token carries the
                         version of the model token before it, so staleness (min version, and the
                         masked histogram) is exactly that of the model's tokens  [C]

Each turn's request carries the whole context (prompt + completion so far) as prompt_ids: the engine
recomputes the prefix every turn (reusing the KV cache across turns is future work).

Limits count completion tokens: a turn asks for min(max_tokens_per_turn, tokens left). The episode
ends with finish_reason "stop" when the env says done, "length" after max_turns model turns or when
the token budget is spent (an observation is appended only if at least one model token still fits
after it: a final observation nobody answers is dropped), "abort" if the engine aborted the turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamrl.engine.base import GenRequest, GenResult, generate
from streamrl.envs.base import Environment
from streamrl.envs.render import TurnRenderer
from streamrl.types import EvalStopped


@dataclass
class EpisodeLimits:
    max_turns: int
    max_total_tokens: int
    max_tokens_per_turn: int


@dataclass
class Episode:
    env: Environment
    renderer: TurnRenderer
    prompt_ids: list[int]
    limits: EpisodeLimits
    temperature: float = 1.0
    top_p: float = 1.0
    tag: Any = None  # the caller's handle, put on every GenRequest of this episode
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # one per env step
    info: dict[str, Any] = field(default_factory=dict)  # the env's infos, later steps overwriting
    turns: int = 0
    finish_reason: str = ""  # "" while running

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    @property
    def reward(self) -> float:
        """The episode's reward: the sum of the env's step rewards (our envs reward only the last)."""
        return float(sum(self.rewards))

    def request(self) -> GenRequest:
        """The next model turn: the whole context so far, capped by the per-turn and total budgets."""
        if self.done:
            raise RuntimeError(f"episode {self.tag!r} is finished ({self.finish_reason}); no next turn")
        left = self.limits.max_total_tokens - len(self.completion_ids)
        return GenRequest(
            self.prompt_ids + self.completion_ids,
            min(self.limits.max_tokens_per_turn, left),
            self.temperature,
            self.top_p,
            tag=self.tag,
        )

    def advance(self, res: GenResult) -> GenRequest | None:
        """Append the model's turn, step the env, append its observation; the next request or None."""
        self.completion_ids += res.token_ids
        self.loss_mask += [1] * len(res.token_ids)
        self.logprobs += res.logprobs
        self.versions += res.versions
        self.turns += 1
        if res.finish_reason == "abort":
            self.finish_reason = "abort"
            return None
        step = self.env.step(self.renderer.decode(res.token_ids))
        self.rewards.append(float(step.reward))
        self.info.update(step.info)
        if step.done:
            self.finish_reason = "stop"
            return None
        if self.turns >= self.limits.max_turns:
            self.finish_reason = "length"
            return None
        ended = res.token_ids[-1] if res.finish_reason == "stop" and res.token_ids else None
        obs = self.renderer.bridge_ids(step.observation, ended)
        if len(self.completion_ids) + len(obs) >= self.limits.max_total_tokens:
            self.finish_reason = "length"
            return None
        version = self.versions[-1] if self.versions else 0
        self.completion_ids += obs
        self.loss_mask += [0] * len(obs)
        self.logprobs += [0.0] * len(obs)
        self.versions += [version] * len(obs)
        return self.request()


def run_episodes(engine: Any, episodes: list[Episode], stop: Callable[[], bool] | None = None) -> None:
    """Drive episodes to the end with batched `engine.generate` (results in request order): one call
    per round of live turns, so episodes that finish early leave the batch. `stop` goes to the engine
    (asked before each decode step); once it says True, EvalStopped is raised."""
    live = [ep for ep in episodes if not ep.done]
    requests = [ep.request() for ep in live]
    while live:
        results = generate(engine, requests, stop)
        if stop is not None and any(r.finish_reason == "abort" for r in results):
            raise EvalStopped(
                f"stopped with {sum(ep.done for ep in episodes)} of {len(episodes)} episodes over"
            )
        still: list[Episode] = []
        requests = []
        for ep, res in zip(live, results, strict=True):
            nxt = ep.advance(res)
            if nxt is not None:
                still.append(ep)
                requests.append(nxt)
        live = still
