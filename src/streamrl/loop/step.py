"""The whole synchronous RL update, top to bottom: rollout -> advantages -> train -> publish weights."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from streamrl.algo import advantage_spec
from streamrl.config import Config
from streamrl.data.replay import ReplayBuffer, train_step
from streamrl.engine.hf import push_policy
from streamrl.loop.step_metrics import step_record
from streamrl.rollout.generate import rollout_groups
from streamrl.rollout.score import Scoring
from streamrl.trainer.trainer import Trainer
from streamrl.types import Group, Problem, TrainBatch, Trajectory


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
    rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float)  # [num_groups, G]
    batch = TrainBatch(trajectories=trajs, advantages=[])
    if trainer is not None:
        rewards = rewards - torch.tensor(trainer.kl_reward_penalty(batch)).view_as(rewards)
    batch.rewards = rewards.flatten().tolist()
    spec = advantage_spec(cfg.advantage.name)
    if spec.token_level:
        batch.advantages = [0.0] * len(trajs)
        return batch
    extra = {}
    if spec.greedy_baseline:  # the greedy response's task reward (no KL term: it is not trained)
        extra["baseline_rewards"] = torch.tensor([_baseline(g).reward for g in groups], dtype=torch.float)
    advantages = spec.fn(rewards, std_normalize=cfg.advantage.std_normalize, **extra)
    batch.advantages = advantages.flatten().tolist()
    return batch


def _episode_advantages(groups: list[Group], cfg: Config) -> TrainBatch:
    """Agent tasks: the estimator sees the [num_groups, G] episode rewards; every trajectory of an
    episode gets that episode's advantage (an episode may have made several trajectories, or none)."""
    rewards = torch.tensor([g.episode_rewards for g in groups], dtype=torch.float)  # [num_groups, G]
    estimator = advantage_spec(cfg.advantage.name).fn
    adv = estimator(rewards, std_normalize=cfg.advantage.std_normalize)
    trajs = [t for g in groups for t in g.trajectories]
    per_traj = [
        float(adv[gi, t.reward_info["episode"]]) for gi, g in enumerate(groups) for t in g.trajectories
    ]
    return TrainBatch(trajectories=trajs, advantages=per_traj, rewards=[t.reward for t in trajs])


def _baseline(group: Group) -> Trajectory:
    if group.baseline is None:
        raise ValueError(f"the advantage needs a greedy baseline for group of problem {group.problem.id}")
    return group.baseline


def rl_step(
    step: int,
    draw: Callable[[int], list[Problem]],
    engine: Any,
    trainer: Trainer,
    tokenizer: Any,
    scoring: Scoring,
    cfg: Config,
    replay: ReplayBuffer | None = None,
) -> tuple[dict[str, Any], list[Group], list[Group]]:
    """One step of synchronous on-policy RL on `draw(B)` new problems.

    With DAPO dynamic sampling, groups whose rewards are all equal are dropped and more problems are
    drawn until B groups are kept (at most rollout.dynamic_sampling_rounds extra rounds; then the
    step trains on what it has). Returns (metrics record, trained groups, dropped groups).
    """
    t0 = time.perf_counter()
    B = cfg.rollout.prompts_per_step
    groups, timing = rollout_groups(engine, tokenizer, scoring, draw(B), cfg, step)
    dropped: list[Group] = []
    if cfg.rollout.dynamic_sampling:
        dropped = [g for g in groups if g.uninformative]
        groups = [g for g in groups if not g.uninformative]
        for _ in range(cfg.rollout.dynamic_sampling_rounds):
            if len(groups) >= B:
                break
            made = len(groups) + len(dropped)
            more, t = rollout_groups(engine, tokenizer, scoring, draw(B - len(groups)), cfg, step, made)
            timing = {k: timing[k] + t[k] for k in timing}
            dropped += [g for g in more if g.uninformative]
            groups += [g for g in more if not g.uninformative]
        if not groups:  # nothing informative in any round: train on the last round (zero gradient)
            groups, dropped = dropped[-B:], dropped[:-B]
    batch = group_advantages(groups, cfg, trainer)
    train = train_step(trainer, batch, replay, step)  # + replayed successes (rollout.replay_share)
    push_policy(engine, trainer)
    wall = time.perf_counter() - t0
    adv = None if advantage_spec(cfg.advantage.name).token_level else batch.advantages  # see gae_* metrics
    record = step_record(step, groups, train, trainer.version - 1, adv)
    record["_advantages"] = adv  # per sample, in the groups' order: groups.jsonl logs them
    record.update(
        step_time=wall,
        tokens_per_s=(record["tokens_generated"] + train["tokens_trained"]) / wall,
        generate_tokens_per_s=record["tokens_generated"] / max(timing["generate_time"], 1e-9),
        train_tokens_per_s=train["tokens_trained"] / max(train["train_time"], 1e-9),
        groups_dropped_zero_variance=len(dropped),
        **timing,
    )
    return record, groups, dropped
