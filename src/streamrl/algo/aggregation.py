"""Loss aggregation: per-token loss [B, T] and mask [B, T] -> scalar.

Each takes `normalizer`, computed over the WHOLE batch by `batch_normalizer`, so that summing the
micro-batch losses of one optimizer step equals the aggregation over the full batch exactly
(a per-micro-batch mean would weight short micro-batches more: the bug verl and TRL both fixed).
"""

from __future__ import annotations

import torch

from streamrl.algo.registry import aggregation


@aggregation("token-mean")
def token_mean(loss: torch.Tensor, mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """sum(loss * mask) / (number of loss tokens in the whole batch). DAPO's token-level loss."""
    return (loss * mask).sum() / normalizer


@aggregation("token-sum")
def token_sum(loss: torch.Tensor, mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """sum(loss * mask) over the whole batch, not normalised (normalizer is 1): the gradient grows
    with the number of tokens; pair it with a smaller learning rate."""
    return (loss * mask).sum() / normalizer


@aggregation("seq-mean-token-mean")
def seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """Mean over sequences of each sequence's token mean (GRPO's original form, GSPO)."""
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / normalizer


@aggregation("seq-mean-token-sum")
def seq_mean_token_sum(loss: torch.Tensor, mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """Mean over sequences of each sequence's token sum."""
    return (loss * mask).sum() / normalizer


@aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """Dr.GRPO: token sums divided by (number of sequences x a constant length), no length bias.
    The constant is the maximum response length (verl 0.9: its loss_scale_factor, by default the
    padded width of the micro-batch)."""
    return (loss * mask).sum() / normalizer


def batch_normalizer(name: str, masks: list[torch.Tensor], horizon: int = 1) -> float:
    """The denominator for aggregation `name` over all micro-batch masks of one optimizer step.

    Sequences are rows with at least one loss token; `horizon` is the constant length of
    seq-mean-token-sum-norm (the maximum response length).
    """
    tokens = float(sum(m.sum() for m in masks))
    seqs = float(sum((m.sum(-1) > 0).sum() for m in masks))
    if name == "token-mean":
        return max(tokens, 1.0)
    if name == "token-sum":
        return 1.0
    if name in ("seq-mean-token-mean", "seq-mean-token-sum"):
        return max(seqs, 1.0)
    if name == "seq-mean-token-sum-norm":
        return max(seqs, 1.0) * horizon
    raise KeyError(f"no normalizer for aggregation '{name}'")
