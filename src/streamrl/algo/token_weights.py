"""Token masks and sample weights applied on top of any policy loss (pure functions)."""

from __future__ import annotations

import torch


def entropy_top_q_mask(entropy: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """Keep the top-q fraction of loss tokens by entropy ("Beyond the 80/20 rule", Wang et al. 2025:
    train only on high-entropy "forking" tokens, q = 0.2). entropy, mask: [B, T] -> float mask [B, T].

    The threshold is the (1 - q) quantile of the entropies of the loss tokens given; ties at the
    threshold are kept. q >= 1 keeps every loss token.
    """
    if q >= 1.0:
        return mask.float()
    valid = mask > 0
    if not valid.any():
        return mask.float()
    threshold = torch.quantile(entropy.detach()[valid].float(), 1.0 - q)
    return (valid & (entropy.detach() >= threshold)).float()


def sign_weights(advantages: torch.Tensor, pos_weight: float, neg_weight: float) -> torch.Tensor:
    """Scale positive and negative advantages separately: W-REINFORCE (Zhu et al. 2025) down-weights
    positives (pos_weight ~ 0.1); pos_weight = 0 trains on negative samples only (NSR)."""
    return torch.where(advantages > 0, advantages * pos_weight, advantages * neg_weight)
