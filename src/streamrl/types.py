"""The few types every layer shares: a problem, one sampled trajectory, a group of them, a batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the reward_error of a score still outstanding when reward.step_budget_s ran out
BUDGET_REASON = "step_budget"
# the reward_errors of a score past reward.timeout_s, and of a judge request past reward.judge_timeout_s
TIMEOUT_REASONS = ("timeout", "JudgeError/timeout")


class EvalStopped(Exception):
    """An evaluation, or a colocated step's rollouts, was asked to stop (Ctrl-C, SIGTERM) before it
    finished: nothing of it counts."""


@dataclass
class Problem:
    """One prompt with what is needed to score an answer to it.

    `messages` is a chat (list of {role, content}); `answer` the reference; `meta` anything the
    scorer needs (for reasoning-gym the full generated entry).
    """

    id: str
    messages: list[dict[str, str]]
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """One sampled response to a prompt, token-in-token-out.

    prompt_ids: [P] and completion_ids: [C] are exactly the tokens seen and produced; loss_mask: [C]
    is 1 on tokens the policy produced; behaviour_logprobs: [C] are the log-probs under the sampling
    distribution that produced each token; versions: [C] the policy version of each token.
    """

    problem_id: str
    group_id: str
    sample_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]
    versions: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    loss_mask: list[int] = field(default_factory=list)
    text: str = ""
    reward: float = 0.0
    correct: bool = False
    reward_info: dict[str, Any] = field(default_factory=dict)
    # speculative rollouts: the request offered drafts (earlier responses, whether or not any token was
    # decided against them); tokens decided against a draft proposal, and how many of them were accepted
    drafted: bool = False
    draft_tokens: int = 0
    draft_accepted: int = 0
    tree_tokens: int = 0  # speculative rollouts: first tokens along the drafts' tree (no decode step)
    # lenient speculative rollouts: [C] the generating policy's log p of each token where
    # behaviour_logprobs hold the lenient rule's mixture's log b (which training reads); empty: the same
    policy_logprobs: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.loss_mask:
            self.loss_mask = [1] * len(self.completion_ids)
        n = len(self.completion_ids)
        if not (len(self.behaviour_logprobs) == len(self.versions) == len(self.loss_mask) == n):
            raise ValueError(
                f"trajectory {self.sample_id}: completion_ids, behaviour_logprobs, versions and loss_mask "
                f"must have equal lengths, got {n}, {len(self.behaviour_logprobs)}, {len(self.versions)}, "
                f"{len(self.loss_mask)}"
            )
        if self.policy_logprobs and len(self.policy_logprobs) != n:
            raise ValueError(
                f"trajectory {self.sample_id}: policy_logprobs must be empty or have the {n} entries of "
                f"completion_ids, got {len(self.policy_logprobs)}"
            )


@dataclass
class Group:
    """All samples drawn for one problem in one step; advantages are computed within a group.

    `baseline` is the scored greedy (temperature 0) response that ReMax subtracts; it is never trained on.
    `episode_rewards` ([G], agent tasks): the reward of each episode, whose calls may make zero, one or
    several trajectories (tagged reward_info["episode"]); advantages are then computed per episode.
    `episode_errors` ([G], agent tasks): why each episode ended in an error ("" when it did not);
    `episode_error_details` its message.
    `episode_correct`, `episode_formatted` ([G], agent tasks): each episode's verdict, which the step's
    accuracy and format rate count once per episode, whatever number of trajectories it made.
    """

    problem: Problem
    trajectories: list[Trajectory]
    baseline: Trajectory | None = None
    episode_rewards: list[float] | None = None
    episode_errors: list[str] | None = None
    episode_error_details: list[str] | None = None  # [G]: each error's message ("" when none)
    episode_correct: list[bool] | None = None
    episode_formatted: list[bool] | None = None

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def uninformative(self) -> bool:
        """Every sample has the same reward (and the greedy baseline, if any, too): zero advantage."""
        values = set(self.rewards if self.episode_rewards is None else self.episode_rewards)
        values |= {self.baseline.reward} if self.baseline is not None else set()
        return len(values) <= 1


@dataclass
class TrainBatch:
    """Flattened trajectories with one advantage per trajectory (outcome reward on every token).

    rewards: the scalar reward each trajectory is trained on (after any KL-in-reward penalty); empty means
    each trajectory's own `reward`. advantage.name=gae ignores `advantages` (the trainer computes
    per-token ones from `rewards` and its value head).
    """

    trajectories: list[Trajectory]
    advantages: list[float]
    rewards: list[float] = field(default_factory=list)
