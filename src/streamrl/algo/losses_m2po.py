"""M2PO (Zheng et al. 2025): no clipping; bound the second moment of the importance weights instead."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from streamrl.algo.loss_inputs import LossParams, LossTensors, ratio_metrics, safe_exp
from streamrl.algo.registry import policy_loss


class M2Cut(NamedTuple):
    """Where M2PO cuts the loss tokens by (log r)^2: those above `value` are dropped, those below kept,
    and those equal to it keep the weight `tied_keep`, the share of them the rule keeps (identical
    samples, which a confident policy draws often, tie token by token: dropping all of them would drop
    more than the fewest)."""

    value: float
    tied_keep: float = 1.0


def m2_cut(sq: torch.Tensor, threshold: float) -> M2Cut:
    """Drop the largest (log r)^2, fewest first, until the mean of the rest is <= threshold. sq: 1-D,
    (log r)^2 of the loss tokens -> the cut (value inf when none is dropped)."""
    vals = torch.sort(sq.detach().flatten(), descending=True).values
    n = len(vals)
    if n == 0:
        return M2Cut(math.inf)
    removed = torch.cat([vals.new_zeros(1), vals.cumsum(0)])  # removed[k] = sum of the k largest
    counts = n - torch.arange(n + 1, dtype=vals.dtype)
    means = (vals.sum() - removed) / counts.clamp(min=1)
    ok = (means <= threshold).nonzero()
    k = int(ok[0]) if len(ok) else n
    if k == 0:
        return M2Cut(math.inf)
    cut = vals[k - 1]
    tied, above = int((vals == cut).sum()), int((vals > cut).sum())
    return M2Cut(float(cut), 1.0 - (k - above) / tied)


def m2_keep(sq: torch.Tensor, mask: torch.Tensor, cut: M2Cut) -> torch.Tensor:
    """The keep weights of `cut` for (log r)^2 `sq` and loss mask `mask` (same shape) -> float, 0 off
    the loss tokens."""
    keep = (sq < cut.value).float() + (sq == cut.value).float() * cut.tied_keep
    return keep * (mask > 0)


def m2_mask(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """M2PO's token weights: 1 for the loss tokens below m2_cut of the loss tokens given, 0 above, the
    tied share at the cut. log_ratio, mask: [B, T] -> keep [B, T] (float)."""
    sq = log_ratio.detach() ** 2
    return m2_keep(sq, mask, m2_cut(sq[mask > 0], threshold))


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
