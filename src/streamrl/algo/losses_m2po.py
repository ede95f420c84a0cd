"""M2PO (Zheng et al. 2025): no clipping; bound the second moment of the importance weights instead."""

from __future__ import annotations

import torch

from streamrl.algo.loss_inputs import LossParams, LossTensors, ratio_metrics, safe_exp
from streamrl.algo.registry import policy_loss


def m2_mask(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """M2PO's token mask: drop the tokens with the largest (log r)^2, fewest first, until the mean of
    (log r)^2 over the kept tokens is <= threshold. log_ratio, mask: [B, T] -> keep mask [B, T] (float)."""
    sq = (log_ratio.detach() ** 2).flatten()
    valid = mask.flatten() > 0
    n = int(valid.sum())
    keep = valid.clone()
    if n == 0:
        return keep.view_as(mask).float()
    vals, order = torch.sort(torch.where(valid, sq, torch.full_like(sq, -1.0)), descending=True)
    vals = vals[:n]  # the valid tokens, largest first
    total = vals.sum()
    removed = torch.cat([vals.new_zeros(1), vals.cumsum(0)])  # removed[k] = sum of the k largest
    counts = n - torch.arange(n + 1, dtype=vals.dtype)
    means = (total - removed) / counts.clamp(min=1)
    ok = (means <= threshold).nonzero()
    k = int(ok[0]) if len(ok) else n
    keep[order[:k]] = False
    return keep.view_as(mask).float()


@policy_loss("m2po", reads=("m2_threshold",))
def m2po(t: LossTensors, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    """M2PO: keep = m2_mask(log r, mask, m2_threshold); loss_t = -A_t * r_t * keep_t with
    r = pi_theta / pi_old (log clamped to +-20). Stays stable with data many versions stale while masking
    very few tokens. [B, T] -> [B, T].
    """
    log_ratio = t.logprobs - t.old_logprobs
    keep = m2_mask(log_ratio, t.mask, p.m2_threshold)
    with torch.no_grad():
        metrics = ratio_metrics(log_ratio, t.mask)
        metrics["m2_masked_frac"] = 1 - float(keep.sum() / t.mask.float().sum().clamp(min=1))
    return -t.advantages * safe_exp(log_ratio) * keep, metrics
