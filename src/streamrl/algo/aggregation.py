"""Loss aggregation: per-token loss [B, T] and mask [B, T] -> scalar.

Each takes `normalizer`, computed over the WHOLE batch by `batch_normalizer`, so that summing the
micro-batch losses of one optimizer step equals the aggregation over the full batch exactly.
"""

from __future__ import annotations

import torch

from streamrl.algo.registry import aggregation


@aggregation("token-mean")
def token_mean(loss: torch.Tensor, mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """sum(loss * mask) / (number of loss tokens in the whole batch). DAPO's token-level loss."""
    return (loss * mask).sum() / normalizer


def batch_normalizer(name: str, masks: list[torch.Tensor]) -> float:
    """The denominator for aggregation `name` over all micro-batch masks of one step."""
    if name == "token-mean":
        return max(float(sum(m.sum() for m in masks)), 1.0)
    raise KeyError(f"no normalizer for aggregation '{name}'")
