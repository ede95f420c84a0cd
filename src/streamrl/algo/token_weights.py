"""Token masks and sample weights applied on top of any policy loss (pure functions)."""

from __future__ import annotations

import torch


def quantile(values: torch.Tensor, p: float) -> float:
    """The p-quantile of a 1-D tensor, linearly interpolated between order statistics (torch.quantile's
    rule, without its 2^24-element limit)."""
    v = torch.sort(values.detach().float().flatten()).values
    pos = p * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return float(v[lo] + (pos - lo) * (v[hi] - v[lo]))


def entropy_top_q_mask(entropy: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """Keep the top-q fraction of loss tokens by entropy ("Beyond the 80/20 rule", Wang et al. 2025:
    train only on high-entropy "forking" tokens, q = 0.2). entropy, mask: [B, T] -> float mask [B, T].

    The threshold is the (1 - q) quantile of the entropies of the loss tokens given (a mini-batch of
    several micro-batches: trainer/mini_batch_cuts.py); ties at the threshold are kept. q >= 1 keeps
    every loss token.
    """
    if q >= 1.0:
        return mask.float()
    valid = mask > 0
    if not valid.any():
        return mask.float()
    return (valid & (entropy.detach() >= quantile(entropy[valid], 1.0 - q))).float()


def sign_weights(advantages: torch.Tensor, pos_weight: float, neg_weight: float) -> torch.Tensor:
    """Scale positive and negative advantages separately: W-REINFORCE (Zhu et al. 2025) down-weights
    positives (pos_weight ~ 0.1); pos_weight = 0 trains on negative samples only (NSR)."""
    return torch.where(advantages > 0, advantages * pos_weight, advantages * neg_weight)
