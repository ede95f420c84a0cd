"""The whole synchronous RL update, top to bottom: rollout -> advantages -> train -> publish weights."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from streamrl.algo import registry
from streamrl.config import Config
from streamrl.data.tasks import Task
from streamrl.runtime.rollout import rollout_groups
from streamrl.trainer.trainer import Trainer
from streamrl.types import Group, Problem, TrainBatch


def group_advantages(groups: list[Group], cfg: Config) -> TrainBatch:
    """Flatten groups into a TrainBatch with one advantage per trajectory."""
    estimator = registry.get(registry.ADVANTAGES, cfg.advantage.name, "advantage estimator")
    rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float)  # [num_groups, G]
    adv = estimator(rewards, std_normalize=cfg.advantage.std_normalize)
    trajs = [t for g in groups for t in g.trajectories]
    return TrainBatch(trajectories=trajs, advantages=adv.flatten().tolist())


def rl_step(
    step: int, problems: list[Problem], engine: Any, trainer: Trainer, tokenizer: Any, task: Task, cfg: Config
) -> dict[str, Any]:
    """One step of synchronous on-policy RL; returns the step's metrics record."""
    t0 = time.perf_counter()
    groups, timing = rollout_groups(engine, tokenizer, task, problems, cfg, step)
    batch = group_advantages(groups, cfg)
    train = trainer.step(batch)
    engine.update_weights(None, trainer.version)  # the engine shares the trainer's module here
    trajs = batch.trajectories
    rewards = [t.reward for t in trajs]
    gen_tokens = sum(len(t.completion_ids) for t in trajs)
    versions = [v for t in trajs for v in t.versions]
    staleness = [trainer.version - 1 - v for v in versions]
    wall = time.perf_counter() - t0
    zero_adv = sum(1 for g in groups if len(set(g.rewards)) == 1)
    return {
        "step": step,
        "policy_version": trainer.version,
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "accuracy": statistics.fmean(float(t.correct) for t in trajs),
        "format_rate": statistics.fmean(float(t.reward_info.get("formatted", False)) for t in trajs),
        "zero_adv_group_frac": zero_adv / len(groups),
        "response_length": gen_tokens / len(trajs),
        "truncation_rate": statistics.fmean(float(t.finish_reason == "length") for t in trajs),
        "tokens_generated": gen_tokens,
        "staleness_max": max(staleness, default=0),
        "staleness_mean": statistics.fmean(staleness) if staleness else 0.0,
        "step_time": wall,
        "tokens_per_s": (gen_tokens + train["tokens_trained"]) / wall,
        "generate_tokens_per_s": gen_tokens / max(timing["generate_time"], 1e-9),
        "train_tokens_per_s": train["tokens_trained"] / max(train["train_time"], 1e-9),
        **timing,
        **train,
    }
