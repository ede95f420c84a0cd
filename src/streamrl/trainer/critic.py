"""PPO critic: a value head on the policy's last hidden state, GAE targets and the clipped value loss.

The head shares the policy's backbone (like TRL's value-head models): a separate critic model would
double the CPU cost. Values sit at completion positions: V[:, j] is read from the hidden state at
position P - 1 + j, the state before completion token j is generated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from streamrl.algo.advantages_token import gae
from streamrl.trainer.batching import MicroBatch
from streamrl.trainer.logprobs import completion_forward


class ValueHead(nn.Module):
    """nn.Linear(hidden, 1), zero-initialised: every value starts at 0 (A = R - 0 on the first step)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [..., H] -> values [...] (fp32)."""
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1).float()


@dataclass
class CriticTargets:
    """Per micro-batch, all [B, C]: values before the update, GAE advantages and returns (0 off-mask)."""

    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


def completion_values(model: Any, head: ValueHead, mb: MicroBatch) -> torch.Tensor:
    """Values at the completion positions of a micro-batch: [B, C] (one forward; grad as the caller's)."""
    _, _, hidden = completion_forward(model, mb, return_hidden=True)
    assert hidden is not None
    return head(hidden)


@torch.no_grad()
def gae_targets(
    model: Any, head: ValueHead, mb: MicroBatch, token_rewards: torch.Tensor, gamma: float, lam: float
) -> CriticTargets:
    """No-grad pass: V_old [B, C], then GAE on token_rewards [B, C] (the outcome reward on each row's last
    loss token: algo.advantages_token.terminal_rewards, or kl_shaped_rewards)."""
    values = completion_values(model, head, mb).cpu()
    mask = mb.loss_mask
    adv, ret = gae(token_rewards, values, mask, gamma=gamma, lam=lam)
    return CriticTargets(old_values=torch.where(mask > 0, values, 0.0), advantages=adv, returns=ret)


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """All [B, C] -> (per-token loss 0.5 * max((V - R)^2, (clip(V, V_old +- clip) - R)^2), clipped mask).

    The clipped mask is 1 where the clipped term is the larger one (it carries no gradient there)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_sq = (values - returns) ** 2
    clipped_sq = (clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped_sq, clipped_sq), (clipped_sq > unclipped_sq).float()
