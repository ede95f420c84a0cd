"""One RL step, the same for every loop: advantages -> optimizer step(s) -> publish the weights -> the
step's record. The colocated loop (loop/colocated.py) and the asynchronous loop (loop/asynchronous.py,
local or Ray workers) differ only in where the next batch of groups comes from and how the new weights
travel; both hand that batch and a `publish` callable to `train_on`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from streamrl.algo import advantage_spec
from streamrl.config import Config
from streamrl.data.replay import ReplayBuffer
from streamrl.loop.step_metrics import step_record
from streamrl.trainer.trainer import Trainer
from streamrl.types import Group, TrainBatch, Trajectory


@dataclass
class StepRecord:
    """One trained step. metrics: its metrics.jsonl line; groups: the groups trained, in batch order;
    advantages: one per trajectory in that order (None for a token-level estimator such as GAE); last:
    the loop ends after it (max_steps, a stop or max_time, as the loop found when the step was done);
    clock: the loop's running totals as of this step, which the saved state keeps (RunState.clock) so
    that a resumed run continues them."""

    step: int
    metrics: dict[str, Any]
    groups: list[Group]
    advantages: list[float] | None
    last: bool = False
    clock: dict[str, float] = field(default_factory=dict)


def train_on(
    step: int,
    groups: list[Group],
    trainer: Trainer,
    cfg: Config,
    publish: Callable[[], None],
    replay: ReplayBuffer | None = None,
) -> StepRecord:
    """The RL update on one batch of groups; `publish` brings the new weights to the engines."""
    version_before = trainer.version
    batch = group_advantages(groups, cfg, trainer)
    train = train_step(trainer, batch, replay, step)
    t_sync = time.perf_counter()
    publish()
    sync = time.perf_counter() - t_sync
    estimator = advantage_spec(cfg.advantage.name)
    adv = None if estimator.token_level else batch.advantages  # see gae_*
    metrics = step_record(step, groups, train, version_before, adv, estimator.group_baseline)
    metrics.update(
        weight_sync_time=sync,
        train_tokens_per_s=train["tokens_trained"] / max(train["train_time"], 1e-9),
    )
    return StepRecord(step, metrics, groups, adv)


def train_step(trainer: Any, batch: TrainBatch, replay: ReplayBuffer | None, step: int) -> dict[str, float]:
    """trainer.step on the batch with replayed samples mixed in; the fresh samples join the buffer."""
    if replay is None:
        return trainer.step(batch)
    mixed, stats = replay.mix(batch, step)
    train = trainer.step(mixed)
    replay.add(batch, step)
    return {**train, **stats}


def group_advantages(groups: list[Group], cfg: Config, trainer: Trainer | None = None) -> TrainBatch:
    """Flatten groups into a TrainBatch with one advantage per trajectory.

    With loss.kl_in=reward the trainer's KL-to-reference penalty is subtracted from each reward
    before the estimator sees it (the logged task rewards stay as they were). The rewards used are
    kept in batch.rewards. A token-level estimator (GAE) needs the value head: it is not called here,
    the advantages are zeros and the trainer computes them from batch.rewards.
    """
    if any(g.episode_rewards is not None for g in groups):
        return _episode_advantages(groups, cfg)
    trajs = [t for g in groups for t in g.trajectories]
    batch = TrainBatch(trajectories=trajs, advantages=[])
    flat = torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float)
    if trainer is not None:
        flat = flat - torch.tensor(trainer.kl_reward_penalty(batch), dtype=torch.float)
    batch.rewards = flat.tolist()
    spec = advantage_spec(cfg.advantage.name)
    if spec.token_level:
        batch.advantages = [0.0] * len(trajs)
        return batch
    rewards, valid = padded_groups(flat, [len(g.trajectories) for g in groups])
    extra = {}
    if spec.greedy_baseline:  # the greedy response's task reward (no KL term: it is not trained)
        extra["baseline_rewards"] = torch.tensor([_baseline(g).reward for g in groups], dtype=torch.float)
    advantages = spec.fn(rewards, valid=valid, std_normalize=cfg.advantage.std_normalize, **extra)
    batch.advantages = advantages[valid].tolist()
    return batch


def padded_groups(flat: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards of groups of the given sizes, concatenated [sum(sizes)] -> (rewards [num_groups, max size]
    right-padded with 0, valid [num_groups, max size] bool): groups may differ in size (filtering)."""
    width = max(sizes, default=0)
    valid = torch.arange(width)[None, :] < torch.tensor(sizes)[:, None]
    rewards = torch.zeros(len(sizes), width, dtype=flat.dtype)
    rewards[valid] = flat
    return rewards, valid


def _episode_advantages(groups: list[Group], cfg: Config) -> TrainBatch:
    """Agent tasks: the estimator sees the [num_groups, G] episode rewards; every trajectory of an
    episode gets that episode's advantage (an episode may have made several trajectories, or none)."""
    eps = [g.episode_rewards or [] for g in groups]
    flat = torch.tensor([r for e in eps for r in e], dtype=torch.float)
    rewards, valid = padded_groups(flat, [len(e) for e in eps])  # [num_groups, G]
    estimator = advantage_spec(cfg.advantage.name).fn
    adv = estimator(rewards, valid=valid, std_normalize=cfg.advantage.std_normalize)
    trajs = [t for g in groups for t in g.trajectories]
    per_traj = [
        float(adv[gi, t.reward_info["episode"]]) for gi, g in enumerate(groups) for t in g.trajectories
    ]
    return TrainBatch(trajectories=trajs, advantages=per_traj, rewards=[t.reward for t in trajs])


def _baseline(group: Group) -> Trajectory:
    if group.baseline is None:
        raise ValueError(f"the advantage needs a greedy baseline for group of problem {group.problem.id}")
    return group.baseline
