"""What every policy loss receives: the tensors of one micro-batch and a frozen parameter object.

A loss is ``fn(t: LossTensors, p: LossParams) -> (per-token loss [B, T], metrics)``. A loss that builds
on another (decoupled PPO on the PPO clip) derives new tensors with ``dataclasses.replace`` and hands
``p`` on unchanged, so it cannot drop a parameter; ``LossSpec.reads`` names the fields of ``p`` a loss
reads, and config validation refuses a non-default value of a field the chosen loss does not read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Every exponentiated log-ratio is clamped to at most this (exp(20) = 4.9e8 stays finite in fp32, and
# its gradient too); ratios beyond it are clipped or masked by every loss anyway.
MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class LossTensors:
    """The tensors of one micro-batch, all [B, T] over completion tokens (B rows, T positions).

    logprobs: log pi_theta of the sampled tokens, with gradient.
    old_logprobs: log-probs of the policy the loss's ratio is taken against: the behaviour policy
        (what the engine sampled with), or the trainer's own log-probs before the step when a rollout
        correction is on (the correction then carries the engine/trainer factor).
    advantages: per-token advantages (an outcome advantage is broadcast over its row).
    mask: loss mask (1 = a token the loss trains on), float.
    prox_logprobs: decoupled PPO's proximal policy (detached); None: the same as old_logprobs.
    m2_keep: M2PO's keep mask [B, T] taken over the whole mini-batch these tensors are part of (the
        trainer takes it when the mini-batch spans several micro-batches); None: over these tensors.
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    prox_logprobs: torch.Tensor | None = None
    m2_keep: torch.Tensor | None = None


@dataclass(frozen=True)
class LossParams:
    """Scalar parameters of the policy losses (the loss.* config keys of the same names).

    eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high] of the ratio (DAPO's clip-higher).
    dual_clip: PPO dual clip c > 1 bounds the loss of A < 0 tokens at -c A (Ye et al. 2020); 0 = off.
    behav_weight_cap: cap on decoupled PPO's pi_prox / pi_behav; 0 = no cap.
    m2_threshold: M2PO's bound on the masked mean of (log r)^2.
    """

    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip: float = 0.0
    behav_weight_cap: float = 0.0
    m2_threshold: float = 0.04


def safe_exp(
    log_ratio: torch.Tensor, low: float = -MAX_LOG_RATIO, high: float = MAX_LOG_RATIO
) -> torch.Tensor:
    """exp(clamp(log_ratio, low, high)): finite value and gradient for any finite input."""
    return torch.exp(log_ratio.clamp(min=low, max=high))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of x over mask > 0 (0 for an empty mask), as a float."""
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def ratio_metrics(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Metrics every loss reports on r = pi_theta / pi_old (log_ratio: [B, T], detached inside):
    ratio_mean, approx_kl (mean of (log r)^2 / 2) and verl's ppo_kl (mean of -log r = log pi_old -
    log pi_theta, k1 of the old policy against the new)."""
    with torch.no_grad():
        m = mask.float()
        lr = log_ratio.detach().clamp(min=-MAX_LOG_RATIO, max=MAX_LOG_RATIO)
        return {
            "ratio_mean": masked_mean(torch.exp(lr), m),
            "approx_kl": masked_mean(0.5 * lr**2, m),
            "ppo_kl": masked_mean(-lr, m),
        }
