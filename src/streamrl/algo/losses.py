"""Policy losses as pure functions of LossInputs -> (per-token loss [B, T], metrics)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from streamrl.algo.registry import policy_loss


@dataclass
class LossInputs:
    """All [B, T] over completion tokens. old_logprobs are those of the policy that sampled the batch."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    eps_low: float = 0.2
    eps_high: float = 0.28


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


@policy_loss("ppo_clip")
def ppo_clip(inp: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clip (DAPO clip-higher).

    r = exp(logprobs - old_logprobs); loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)).
    Returns per-token loss [B, T] (unmasked; aggregation applies the mask) and detached metrics.
    """
    log_ratio = inp.logprobs - inp.old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -inp.advantages * ratio
    clipped = -inp.advantages * ratio.clamp(1 - inp.eps_low, 1 + inp.eps_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        m = inp.mask.float()
        metrics = {
            "clip_frac_low": _masked_mean(((ratio < 1 - inp.eps_low) & (inp.advantages < 0)).float(), m),
            "clip_frac_high": _masked_mean(((ratio > 1 + inp.eps_high) & (inp.advantages > 0)).float(), m),
            "ratio_mean": _masked_mean(ratio, m),
            "approx_kl": _masked_mean(0.5 * log_ratio**2, m),
        }
    return loss, metrics
