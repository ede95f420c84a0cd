"""PPO-family policy losses: the clipped surrogate and decoupled PPO.

Each is ``fn(t: LossTensors, p: LossParams) -> (per-token loss [B, T], metrics)`` (algo/loss_inputs.py):
the loss is unmasked (the aggregation applies the mask) and the metrics are detached floats.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from streamrl.algo.loss_inputs import (
    MAX_LOG_RATIO,
    LossParams,
    LossTensors,
    masked_mean,
    ratio_metrics,
    safe_exp,
)
from streamrl.algo.registry import policy_loss


@policy_loss("ppo_clip", reads=("eps_low", "eps_high", "dual_clip"))
def ppo_clip(t: LossTensors, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clip (DAPO clip-higher) and optional dual clip.

    r = exp(clamp(logprobs - old_logprobs, +-20)); loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high));
    with dual_clip = c > 0, tokens with A < 0 get min(loss, -c A) (Ye et al. 2020).
    Metrics: clip_frac_low / clip_frac_high (share of tokens clipped below / above), pg_clipfrac_lower
    (share where the dual clip bounds the loss; verl's name), ratio_mean/max/min, approx_kl, ppo_kl.
    """
    log_ratio = (t.logprobs - t.old_logprobs).clamp(min=-MAX_LOG_RATIO, max=MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    adv = t.advantages
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - p.eps_low, 1 + p.eps_high)
    loss = torch.maximum(unclipped, clipped)
    dual_bound = torch.zeros_like(loss, dtype=torch.bool)
    if p.dual_clip > 0:  # for A < 0 the loss is at most -c A
        dual_bound = (adv < 0) & (loss > -p.dual_clip * adv)
        loss = torch.where(adv < 0, torch.minimum(loss, -p.dual_clip * adv), loss)
    with torch.no_grad():
        m = t.mask.float()
        metrics = ratio_metrics(log_ratio, m)
        metrics.update(
            clip_frac_low=masked_mean(((ratio < 1 - p.eps_low) & (adv < 0)).float(), m),
            clip_frac_high=masked_mean(((ratio > 1 + p.eps_high) & (adv > 0)).float(), m),
            pg_clipfrac_lower=masked_mean(dual_bound.float(), m),
            ratio_max=float(ratio[m > 0].max()) if m.any() else 1.0,
            ratio_min=float(ratio[m > 0].min()) if m.any() else 1.0,
        )
    return loss, metrics


@policy_loss(
    "decoupled_ppo",
    proximal=True,
    behaviour_weight=True,
    reads=("eps_low", "eps_high", "dual_clip", "behav_weight_cap", "prox"),
)
def decoupled_ppo(t: LossTensors, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO (AReaL): the clip is around the proximal policy, staleness is corrected by weight.

    r = pi_theta / pi_prox, w = pi_prox / pi_behav (detached, log clamped to +-20, capped at
    behav_weight_cap if > 0), loss = w * ppo_clip(r) with every parameter of p (dual clip included).
    old_logprobs are pi_behav (what the engine sampled with). With pi_prox = pi_behav, w = 1 and this is
    exactly ppo_clip, for every p.
    """
    prox = t.old_logprobs if t.prox_logprobs is None else t.prox_logprobs.detach()
    loss, metrics = ppo_clip(replace(t, old_logprobs=prox, prox_logprobs=None), p)
    with torch.no_grad():
        m = t.mask.float()
        w = safe_exp(prox - t.old_logprobs)
        if p.behav_weight_cap > 0:
            metrics["behav_weight_capped_frac"] = masked_mean((w > p.behav_weight_cap).float(), m)
            w = w.clamp(max=p.behav_weight_cap)
        metrics["behav_weight_mean"] = masked_mean(w, m)
        metrics["behav_weight_max"] = float((w * m).max()) if m.any() else 1.0
    return w * loss, metrics
