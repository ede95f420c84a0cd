"""Advantage estimators: rewards of each group -> one advantage per sample (outcome reward on every token).

Outcome-level estimators share the signature ``fn(rewards, **kwargs) -> advantages`` with rewards of shape
[num_groups, G] (G samples per prompt) and advantages of the same shape. All of them accept and ignore
unknown keyword arguments, because the caller passes ``std_normalize=`` to every estimator. The token-level
GAE estimator for PPO has its own signature (see ``gae``). All functions are pure: inputs are not modified.
"""

from __future__ import annotations

from typing import Any

import torch

from streamrl.algo.registry import advantage


@advantage("grpo")
def grpo(rewards: torch.Tensor, std_normalize: bool = True, eps: float = 1e-6, **_: Any) -> torch.Tensor:
    """GRPO (DeepSeekMath): A_i = (r_i - mean(r)) / (std(r) + eps) within each group.

    rewards: [num_groups, G] -> [num_groups, G]. std is the unbiased (Bessel) estimate, as in verl and
    TRL; with std_normalize=False this is Dr.GRPO's advantage. A group of one sample gets A = 0.
    """
    if rewards.shape[-1] < 2:
        return torch.zeros_like(rewards)
    centered = rewards - rewards.mean(dim=-1, keepdim=True)
    if not std_normalize:
        return centered
    return centered / (rewards.std(dim=-1, keepdim=True) + eps)


@advantage("dr_grpo")
def dr_grpo(rewards: torch.Tensor, **_: Any) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean(r) per group.

    rewards: [num_groups, G] -> [num_groups, G]. No division by the group std (which up-weights prompts
    that are nearly always right or wrong). ``std_normalize`` is ignored. A group of one sample gets A = 0.
    """
    if rewards.shape[-1] < 2:
        return torch.zeros_like(rewards)
    return rewards - rewards.mean(dim=-1, keepdim=True)


@advantage("rloo")
def rloo(rewards: torch.Tensor, **_: Any) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, "Back to Basics"): leave-one-out baseline within each group.

    A_i = r_i - (sum_j r_j - r_i) / (G - 1) = G / (G - 1) * (r_i - mean(r)).
    rewards: [num_groups, G] -> [num_groups, G]. ``std_normalize`` is ignored. G = 1 gets A = 0 (no other
    sample to form a baseline from).
    """
    g = rewards.shape[-1]
    if g < 2:
        return torch.zeros_like(rewards)
    loo_baseline = (rewards.sum(dim=-1, keepdim=True) - rewards) / (g - 1)
    return rewards - loo_baseline


def _batch_whiten(x: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean(x)) / (std(x) + eps) over ALL elements of x (unbiased std); a single element gives 0."""
    if x.numel() < 2:
        return torch.zeros_like(x)
    return (x - x.mean()) / (x.std() + eps)


@advantage("reinforce_pp")
def reinforce_pp(rewards: torch.Tensor, eps: float = 1e-6, **_: Any) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262), outcome reward: normalise over the WHOLE batch.

    A = (r - mean_all(r)) / (std_all(r) + eps), with mean/std over all num_groups * G samples together
    (no per-prompt baseline), std the unbiased (Bessel, torch default) estimate and eps = 1e-6.
    rewards: [num_groups, G] -> [num_groups, G]. ``std_normalize`` is ignored. A batch of one element
    gets A = 0. Normalisation is per sample, not per token (verl/OpenRLHF whiten over response tokens).
    """
    return _batch_whiten(rewards, eps)


@advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(rewards: torch.Tensor, eps: float = 1e-6, **_: Any) -> torch.Tensor:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262): group-mean baseline, then batch normalisation.

    c = r - mean_group(r);  A = (c - mean_all(c)) / (std_all(c) + eps).
    mean_all(c) is 0 up to float error but is kept to follow the formula. std is the unbiased (Bessel,
    torch default) estimate over all num_groups * G samples; eps = 1e-6.
    rewards: [num_groups, G] -> [num_groups, G]. ``std_normalize`` is ignored. A group of one sample has
    c = 0 (its own mean); a batch of one element gets A = 0.
    """
    centered = rewards - rewards.mean(dim=-1, keepdim=True)
    return _batch_whiten(centered, eps)


@advantage("remax", greedy_baseline=True)
def remax(rewards: torch.Tensor, baseline_rewards: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
    """ReMax (Li et al. 2023, arXiv:2310.10505): baseline = reward of the greedy response to the prompt.

    A_i = r_i - b, with b the reward of the greedy (temperature 0) decode of the same prompt.
    rewards: [num_groups, G]; baseline_rewards: [num_groups] (one greedy reward per prompt)
    -> [num_groups, G]. ``std_normalize`` is ignored. Raises ValueError if baseline_rewards is missing.
    """
    if baseline_rewards is None:
        raise ValueError(
            "ReMax needs the greedy-decode reward of each prompt: pass baseline_rewards=[num_groups]"
        )
    if baseline_rewards.shape != rewards.shape[:1]:
        raise ValueError(
            f"ReMax baseline_rewards must have shape [num_groups]={list(rewards.shape[:1])}, "
            f"got {list(baseline_rewards.shape)}"
        )
    return rewards - baseline_rewards.to(rewards.dtype)[:, None]


@advantage("gae", token_level=True)
def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE for PPO (Schulman et al. 2016, arXiv:1506.02438). NOT an outcome-level estimator.

    token_rewards, values, mask: [B, T] -> (advantages [B, T], returns [B, T]).
    Positions with mask 0 are skipped as if absent (right/left padding or holes):
        delta_t = r_t + gamma * V_next - V_t,   A_t = delta_t + gamma * lam * A_next,
    where "next" is the next VALID token of the same row (V_next = A_next = 0 after the last valid token).
    returns = advantages + values on valid tokens; masked positions get advantage 0 and return 0 (their
    rewards/values are never read, so padding may hold anything finite or not). gamma = lam = 1 (the
    Open-Reasoner-Zero setting) with a reward only on the last token gives A_t = R - V_t. No whitening is
    applied; pass detached values (the function is differentiable but PPO treats advantages as constants).
    """
    valid = mask.bool()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    next_value = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    next_adv = torch.zeros_like(next_value)
    columns: list[torch.Tensor] = []
    for t in reversed(range(values.shape[1])):
        ok = valid[:, t]
        delta = token_rewards[:, t].to(values.dtype) + gamma * next_value - values[:, t]
        adv_t = torch.where(ok, delta + gamma * lam * next_adv, zero)
        columns.append(adv_t)
        next_value = torch.where(ok, values[:, t], next_value)
        next_adv = torch.where(ok, adv_t, next_adv)
    advantages = torch.stack(columns[::-1], dim=1) if columns else torch.zeros_like(values)
    returns = torch.where(valid, advantages + values, zero)
    return advantages, returns
