"""Policy losses as pure functions of LossInputs -> (per-token loss [B, T], metrics)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from streamrl.algo.registry import policy_loss


@dataclass
class LossInputs:
    """All [B, T] over completion tokens. old_logprobs are those of the policy that sampled the batch."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    eps_low: float = 0.2
    eps_high: float = 0.28
    prox_logprobs: torch.Tensor | None = None  # [B, T] decoupled PPO's proximal policy; None: = old
    behav_weight_cap: float = 0.0  # cap on pi_prox / pi_behav; 0 = no cap
    dual_clip: float = 0.0  # PPO dual clip c (> 1) bounds the loss of A < 0 tokens at -c A; 0 = off
    m2_threshold: float = 0.04  # M2PO: bound on the masked mean of (log r)^2


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


@policy_loss("ppo_clip")
def ppo_clip(inp: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clip (DAPO clip-higher).

    r = exp(logprobs - old_logprobs); loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)).
    Returns per-token loss [B, T] (unmasked; aggregation applies the mask) and detached metrics.
    """
    log_ratio = (inp.logprobs - inp.old_logprobs).clamp(min=-20.0, max=20.0)  # exp stays finite
    ratio = torch.exp(log_ratio)
    unclipped = -inp.advantages * ratio
    clipped = -inp.advantages * ratio.clamp(1 - inp.eps_low, 1 + inp.eps_high)
    loss = torch.maximum(unclipped, clipped)
    if inp.dual_clip > 0:  # Ye et al. 2020: for A < 0 the loss is at most -c A (c = dual_clip)
        loss = torch.where(inp.advantages < 0, torch.minimum(loss, -inp.dual_clip * inp.advantages), loss)
    with torch.no_grad():
        m = inp.mask.float()
        metrics = {
            "clip_frac_low": _masked_mean(((ratio < 1 - inp.eps_low) & (inp.advantages < 0)).float(), m),
            "clip_frac_high": _masked_mean(((ratio > 1 + inp.eps_high) & (inp.advantages > 0)).float(), m),
            "ratio_mean": _masked_mean(ratio, m),
            "ratio_max": float(ratio[m > 0].max()) if m.any() else 1.0,
            "ratio_min": float(ratio[m > 0].min()) if m.any() else 1.0,
            "approx_kl": _masked_mean(0.5 * log_ratio**2, m),
        }
    return loss, metrics


@policy_loss("decoupled_ppo", proximal=True)
def decoupled_ppo(inp: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO (AReaL): the clip is around the proximal policy, staleness is corrected by weight.

    r = pi_theta / pi_prox, w = pi_prox / pi_behav (detached, capped at behav_weight_cap if > 0),
    loss = w * max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)). old_logprobs are pi_behav (what the
    engine sampled with). With pi_prox = pi_behav, w = 1 and this is exactly ppo_clip.
    """
    prox = inp.old_logprobs if inp.prox_logprobs is None else inp.prox_logprobs.detach()
    loss, metrics = ppo_clip(
        LossInputs(inp.logprobs, prox, inp.advantages, inp.mask, inp.eps_low, inp.eps_high)
    )
    with torch.no_grad():
        w = torch.exp(prox - inp.old_logprobs)
        if inp.behav_weight_cap > 0:
            capped = w > inp.behav_weight_cap
            metrics["behav_weight_capped_frac"] = _masked_mean(capped.float(), inp.mask.float())
            w = w.clamp(max=inp.behav_weight_cap)
        metrics["behav_weight_mean"] = _masked_mean(w, inp.mask.float())
        metrics["behav_weight_max"] = float((w * inp.mask).max()) if inp.mask.any() else 1.0
    return w * loss, metrics
