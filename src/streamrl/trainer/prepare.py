"""What a batch needs before the policy's forward: its micro-batches, token-level advantages, critic
targets, and the reference model's KL (loss.kl_in=token_reward or reward). Each function reads the
Trainer `tr` (trainer/trainer.py) it is called for: its config sections, models and autocast."""

from __future__ import annotations

from typing import Any

import torch

from streamrl.models.attention import training_kernels
from streamrl.trainer.batching import MicroBatch, collate, split_by_token_budget
from streamrl.trainer.critic import CriticTargets, gae_targets
from streamrl.trainer.layout import collate_group, split_batch
from streamrl.trainer.logprobs import completion_logprobs
from streamrl.trainer.objective import token_rewards, whole_batch_advantages
from streamrl.types import TrainBatch


def prepare_batch(tr: Any, batch: TrainBatch) -> tuple[list[MicroBatch], list[CriticTargets | None]]:
    """Micro-batches to train on and, with advantage.name=gae, their critic targets.

    A token-level estimator puts each trajectory's reward (batch.rewards, else its own reward) on its
    last loss token (minus kl_coef * KL per token with loss.kl_in=token_reward); its per-token
    advantages overwrite the micro-batches' (batch.advantages are ignored). gae: a no-grad pass
    computes V_old [B, C] per micro-batch, GAE gives advantages and returns for the value loss.
    reinforce_pp_token: one call over the whole batch (it whitens over all of its tokens).
    """
    groups = split_batch(tr.train, batch)
    mbs = [collate_group(tr.train, batch, g, tr.pad_id) for g in groups]
    spec, a = tr.advantage_spec, tr.advantage
    if not spec.token_level:
        return mbs, [None] * len(mbs)
    rewards = torch.tensor(batch.rewards or [t.reward for t in batch.trajectories], dtype=torch.float)
    per_mb = [
        token_rewards(mb.loss_mask, rewards[g], token_kl(tr, mb), tr.loss.kl_coef)
        for g, mb in zip(groups, mbs)
    ]
    if not spec.critic:
        n = len(batch.trajectories)
        masks = [mb.loss_mask for mb in mbs]
        for mb, adv in zip(mbs, whole_batch_advantages(spec.fn, groups, per_mb, masks, n, a.gamma)):
            mb.advantages = adv
        return mbs, [None] * len(mbs)
    assert tr.value_head is not None
    targets: list[CriticTargets | None] = []
    with tr._autocast(), tr._compute_weights(), training_kernels():  # V_old on the training forward's path
        for mb, rew in zip(mbs, per_mb):
            tg = gae_targets(tr.model, tr.value_head, mb, rew, a.gamma, a.lam)
            mb.advantages = tg.advantages
            targets.append(tg)
    return mbs, targets


def token_kl(tr: Any, mb: MicroBatch) -> torch.Tensor | None:
    """Per-token KL of the behaviour policy to the reference [B, C] (loss.kl_in=token_reward only)."""
    if tr.ref_model is None or tr.loss.kl_in != "token_reward":
        return None
    with torch.no_grad(), tr._autocast():
        ref_lp, _ = completion_logprobs(tr.ref_model, mb, tr.temperature)
    return tr.kl(mb.old_logprobs, ref_lp.cpu())


def kl_reward_penalty(tr: Any, batch: TrainBatch) -> list[float]:
    """kl_coef * sum over each trajectory's loss tokens of KL(behaviour || reference) (no grad)."""
    if tr.ref_model is None or tr.loss.kl_in != "reward":
        return [0.0] * len(batch.trajectories)
    out = [0.0] * len(batch.trajectories)
    lengths = [(len(t.prompt_ids), len(t.completion_ids)) for t in batch.trajectories]
    for idx in split_by_token_budget(lengths, tr.train.token_budget):
        mb = collate([batch.trajectories[i] for i in idx], [0.0] * len(idx), tr.pad_id)
        with torch.no_grad(), tr._autocast():
            ref_lp, _ = completion_logprobs(tr.ref_model, mb, tr.temperature)
        kl = tr.kl(mb.old_logprobs, ref_lp.cpu()) * mb.loss_mask
        for row, i in enumerate(idx):
            out[i] = tr.loss.kl_coef * float(kl[row].sum())
    return out
