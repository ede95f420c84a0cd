"""Advantage estimators: rewards of each group -> one advantage per sample (outcome reward on every token)."""

from __future__ import annotations

import torch

from streamrl.algo.registry import advantage


@advantage("grpo")
def grpo(rewards: torch.Tensor, std_normalize: bool = True, eps: float = 1e-6) -> torch.Tensor:
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
