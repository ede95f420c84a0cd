"""Policy losses built on importance weights rather than PPO's trust region: GSPO, CISPO, M2PO,
REINFORCE and PipelineRL's truncated-IS REINFORCE. Each: LossInputs -> (per-token loss [B, T], metrics);
old_logprobs are the behaviour policy's (what sampled the tokens)."""

from __future__ import annotations

import torch

from streamrl.algo.losses import LossInputs, _masked_mean
from streamrl.algo.registry import policy_loss


def _ratio_metrics(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    m = mask.float()
    return {
        "ratio_mean": _masked_mean(torch.exp(log_ratio), m),
        "approx_kl": _masked_mean(0.5 * log_ratio**2, m),
    }


@policy_loss("gspo")
def gspo(inp: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025): one length-normalised ratio per sequence, clipped per sequence.

    s_i = exp(mean_t log r_it) over the sequence's loss tokens; loss_i = max(-A_i s_i, -A_i clip(s_i,
    1 - eps_low, 1 + eps_high)), put on every token of sequence i ([B, T]; pair it with the
    seq-mean-token-mean aggregation, as the paper does). The paper's eps are tiny (3e-4 / 4e-4).
    """
    m = inp.mask.float()
    log_ratio = inp.logprobs - inp.old_logprobs
    seq_log_ratio = (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1)  # [B]
    s = torch.exp(seq_log_ratio)[:, None]  # [B, 1]
    adv = inp.advantages
    loss = torch.maximum(-adv * s, -adv * s.clamp(1 - inp.eps_low, 1 + inp.eps_high)).expand_as(log_ratio)
    with torch.no_grad():
        clipped = ((s < 1 - inp.eps_low) | (s > 1 + inp.eps_high)).float().expand_as(m)
        metrics = _ratio_metrics(log_ratio, inp.mask)
        metrics["seq_clip_frac"] = _masked_mean(clipped, m)
    return loss, metrics


@policy_loss("cispo")
def cispo(inp: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, 2025): clip the importance weight, not the update, so every token keeps a
    gradient: loss_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * log pi_t. [B, T] -> [B, T].
    MiniMax use no lower bound in practice: set eps_low >= 1 for that."""
    log_ratio = inp.logprobs - inp.old_logprobs
    with torch.no_grad():
        w = torch.exp(log_ratio).clamp(min=max(0.0, 1 - inp.eps_low), max=1 + inp.eps_high)
        metrics = _ratio_metrics(log_ratio, inp.mask)
        metrics["is_clip_frac"] = _masked_mean((w != torch.exp(log_ratio)).float(), inp.mask.float())
    return -w * inp.advantages * inp.logprobs, metrics


@policy_loss("truncated_is")
def truncated_is(inp: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """PipelineRL's REINFORCE with truncated importance sampling:
    loss_t = -sg(min(r_t, 1 + eps_high)) * A_t * log pi_t. [B, T] -> [B, T]."""
    log_ratio = inp.logprobs - inp.old_logprobs
    with torch.no_grad():
        w = torch.exp(log_ratio).clamp(max=1 + inp.eps_high)
        metrics = _ratio_metrics(log_ratio, inp.mask)
        metrics["is_clip_frac"] = _masked_mean(
            (torch.exp(log_ratio) > 1 + inp.eps_high).float(), inp.mask.float()
        )
    return -w * inp.advantages * inp.logprobs, metrics


@policy_loss("reinforce")
def reinforce(inp: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """Plain REINFORCE (Williams 1992), on-policy: loss_t = -A_t * log pi_t. [B, T] -> [B, T]."""
    with torch.no_grad():
        metrics = _ratio_metrics(inp.logprobs - inp.old_logprobs, inp.mask)
    return -inp.advantages * inp.logprobs, metrics


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


@policy_loss("m2po")
def m2po(inp: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """M2PO (Zheng et al. 2025): no clipping; bound the second moment of the IS weights instead.

    keep = m2_mask(log r, mask, m2_threshold); loss_t = -A_t * r_t * keep_t with r = pi_theta/pi_behav.
    Stays stable with data many versions stale while masking very few tokens. [B, T] -> [B, T].
    """
    log_ratio = inp.logprobs - inp.old_logprobs
    keep = m2_mask(log_ratio, inp.mask, inp.m2_threshold)
    with torch.no_grad():
        metrics = _ratio_metrics(log_ratio, inp.mask)
        metrics["m2_masked_frac"] = 1 - float(keep.sum() / inp.mask.float().sum().clamp(min=1))
    return -inp.advantages * torch.exp(log_ratio) * keep, metrics
