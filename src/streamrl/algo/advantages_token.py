"""Token-level advantage estimators and the per-token rewards they read.

Their signature is ``fn(token_rewards [B, T], mask [B, T], ...) -> (advantages [B, T], returns [B, T])``;
the trainer calls them (it has the masks, and GAE's value head). Positions with mask 0 (padding, or
holes such as tool output inside an agent trajectory) are skipped as if absent: they are never read,
carry nothing from one valid token to the next, and get advantage 0 and return 0. All functions are pure.
"""

from __future__ import annotations

from typing import Any

import torch

from streamrl.algo.registry import advantage


def terminal_rewards(mask: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """mask: [B, T], rewards: [B] -> [B, T] with each row's reward on its LAST mask token, 0 elsewhere.

    A row without loss tokens gets no reward (its advantages are then zero everywhere).
    """
    B, T = mask.shape
    valid = mask > 0
    pos = torch.arange(T, device=mask.device).expand(B, T)
    last = torch.where(valid, pos, torch.full_like(pos, -1)).max(dim=-1).values  # [B], -1 if empty
    out = torch.zeros(B, T, dtype=torch.float, device=mask.device)
    has = last >= 0
    out[has.nonzero().squeeze(-1), last[has]] = rewards.to(out.device, torch.float)[has]
    return out


def kl_shaped_rewards(
    rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """Per-token KL reward shaping (verl's use_kl_in_reward; InstructGPT): r_t = R 1[t = last] - kl_coef KL_t.

    rewards: [B] outcome rewards; mask, kl: [B, T] (kl: a per-token KL estimate of the behaviour policy
    against the reference) -> token rewards [B, T], 0 off the mask. Feeds a token-level estimator.
    """
    valid = mask > 0
    penalty = torch.where(valid, kl_coef * kl.float(), torch.zeros((), dtype=torch.float, device=kl.device))
    return terminal_rewards(mask, rewards) - penalty


def _masked_whiten(x: torch.Tensor, valid: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the valid elements (unbiased var), 0 elsewhere; fewer than two
    valid elements give 0."""
    n = int(valid.sum())
    if n < 2:
        return torch.zeros_like(x)
    vals = x[valid]
    out = (x - vals.mean()) * torch.rsqrt(vals.var() + eps)
    return torch.where(valid, out, torch.zeros_like(out))


@advantage("reinforce_pp_token", token_level=True, reads=("gamma",), group_baseline=False)
def reinforce_pp_token(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ in its token-level form (Hu 2025; verl's reinforce_plus_plus): discounted returns
    G_t = r_t + gamma * G_next (next = the next VALID token of the row), whitened over every valid token
    of the batch: A = (G - mean) / sqrt(var + 1e-8), var unbiased.

    token_rewards, mask: [B, T] -> (advantages [B, T], returns [B, T]). With an outcome reward R on the
    last token, G_t = gamma^(k) R where k counts the valid tokens after t. Whitening over tokens weights
    long answers more than the per-sample ``reinforce_pp``; pass the whole batch, not a micro-batch.
    """
    valid = mask.bool()
    zero = torch.zeros((), dtype=torch.float, device=token_rewards.device)
    running = torch.zeros(token_rewards.shape[0], dtype=torch.float, device=token_rewards.device)
    columns: list[torch.Tensor] = []
    for t in reversed(range(token_rewards.shape[1])):
        ok = valid[:, t]
        g_t = token_rewards[:, t].float() + gamma * running
        columns.append(torch.where(ok, g_t, zero))
        running = torch.where(ok, g_t, running)
    returns = (
        torch.stack(columns[::-1], dim=1) if columns else torch.zeros_like(token_rewards, dtype=torch.float)
    )
    return _masked_whiten(returns, valid), returns


@advantage("gae", token_level=True, critic=True, reads=("gamma", "lam"), group_baseline=False)
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
