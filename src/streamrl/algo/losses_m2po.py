"""M2PO (Zheng et al. 2025): no clipping; bound the second moment of the importance weights instead."""

from __future__ import annotations

import math

import torch

from streamrl.algo.loss_inputs import LossParams, LossTensors, ratio_metrics, safe_exp
from streamrl.algo.registry import policy_loss


def m2_cut(sq: torch.Tensor, threshold: float) -> float:
    """The smallest (log r)^2 that M2PO drops: drop the largest values, fewest first, until the mean of
    the rest is <= threshold. sq: 1-D, (log r)^2 of the loss tokens -> inf when none is dropped."""
    vals = torch.sort(sq.detach().flatten(), descending=True).values
    n = len(vals)
    if n == 0:
        return math.inf
    removed = torch.cat([vals.new_zeros(1), vals.cumsum(0)])  # removed[k] = sum of the k largest
    counts = n - torch.arange(n + 1, dtype=vals.dtype)
    means = (vals.sum() - removed) / counts.clamp(min=1)
    ok = (means <= threshold).nonzero()
    k = int(ok[0]) if len(ok) else n
    return float(vals[k - 1]) if k else math.inf


def m2_mask(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """M2PO's token mask: keep the loss tokens whose (log r)^2 is below m2_cut of the loss tokens given
    (ties at the cut are dropped). log_ratio, mask: [B, T] -> keep mask [B, T] (float)."""
    sq = log_ratio.detach() ** 2
    valid = mask > 0
    return (valid & (sq < m2_cut(sq[valid], threshold))).float()


@policy_loss("m2po", reads=("m2_threshold",))
def m2po(t: LossTensors, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    """M2PO: keep = t.m2_keep or m2_mask(log r, mask, m2_threshold); loss_t = -A_t * r_t * keep_t with
    r = pi_theta / pi_old (log clamped to +-20). Stays stable with data many versions stale while masking
    very few tokens. [B, T] -> [B, T].
    """
    log_ratio = t.logprobs - t.old_logprobs
    keep = m2_mask(log_ratio, t.mask, p.m2_threshold) if t.m2_keep is None else t.m2_keep
    with torch.no_grad():
        metrics = ratio_metrics(log_ratio, t.mask)
        metrics["m2_masked_frac"] = 1 - float(keep.sum() / t.mask.float().sum().clamp(min=1))
    return -t.advantages * safe_exp(log_ratio) * keep, metrics
