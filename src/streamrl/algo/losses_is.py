"""Policy losses built on importance weights rather than PPO's token trust region: GSPO (sequence and
token form), CISPO, REINFORCE and PipelineRL's truncated-IS REINFORCE. Each is
``fn(t: LossTensors, p: LossParams) -> (per-token loss [B, T], metrics)``; old_logprobs are the policy
the ratio is taken against (the behaviour policy unless a rollout correction is on)."""

from __future__ import annotations

import torch

from streamrl.algo.loss_inputs import LossParams, LossTensors, masked_mean, ratio_metrics, safe_exp
from streamrl.algo.registry import policy_loss

# GSPO's sequence log-ratio is clamped to at most 10 before exp (verl's bound): a sequence whose
# length-normalised ratio passes e^10 is far outside any clip range, and exp stays finite.
GSPO_MAX_LOG_RATIO = 10.0


def _seq_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Masked mean over each row: [B, T] -> [B, 1] (0 for a row without loss tokens)."""
    return ((x * m).sum(-1) / m.sum(-1).clamp(min=1))[:, None]


def _gspo_metrics(
    log_ratio: torch.Tensor, s: torch.Tensor, adv: torch.Tensor, m: torch.Tensor, p: LossParams
) -> dict[str, float]:
    """seq_clip_frac: the share of loss tokens whose sequence ratio s ([B, 1]) the clip holds, i.e. below
    the band with a negative advantage or above it with a positive one (adv: [B, 1] or [B, T]); outside
    the band on the other side the loss keeps the unclipped term and its gradient."""
    with torch.no_grad():
        low, high = (s < 1 - p.eps_low) & (adv < 0), (s > 1 + p.eps_high) & (adv > 0)
        clipped = (low | high).float().expand_as(m)
        metrics = ratio_metrics(log_ratio, m)
        metrics["seq_clip_frac"] = masked_mean(clipped, m)
    return metrics


@policy_loss("gspo", reads=("eps_low", "eps_high"))
def gspo(t: LossTensors, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025), sequence level: one length-normalised ratio and one advantage per sequence.

    s_i = exp(min(mean_t log r_it, 10)) over the sequence's loss tokens; A_i = the mean of its token
    advantages (the outcome advantage itself when it is broadcast); loss_i = max(-A_i s_i, -A_i clip(s_i,
    1 - eps_low, 1 + eps_high)), put on every token of sequence i ([B, T]; pair it with the
    seq-mean-token-mean aggregation, as the paper does). The gradient of a token's log-prob is
    -A_i s_i / |y_i| (unclipped): every token of a sequence gets the same one. The paper's eps are tiny
    (3e-4 / 4e-4).
    """
    m = t.mask.float()
    log_ratio = t.logprobs - t.old_logprobs
    s = torch.exp(_seq_mean(log_ratio, m).clamp(max=GSPO_MAX_LOG_RATIO))  # [B, 1]
    adv = _seq_mean(t.advantages, m)  # [B, 1]
    loss = torch.maximum(-adv * s, -adv * s.clamp(1 - p.eps_low, 1 + p.eps_high)).expand_as(log_ratio)
    return loss, _gspo_metrics(log_ratio, s, adv, m, p)


@policy_loss("gspo_token", reads=("eps_low", "eps_high"))
def gspo_token(t: LossTensors, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO-token (Zheng et al. 2025; verl's "gspo"): the sequence ratio's value, each token's own gradient.

    s_it = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)], i.e. log s_it = log pi_t - sg[log pi_t] +
    sg[mean_t log r_it], clamped to at most 10; loss_t = max(-A_t s_it, -A_t clip(s_it, 1 - eps_low,
    1 + eps_high)). Its value equals gspo's when A is constant over a sequence (an outcome advantage);
    the gradient of token t is -A_t s_i (/ |y_i| under seq-mean-token-mean), so with advantages that vary
    inside a sequence (gae) each token follows its own advantage, where gspo uses the sequence mean.
    """
    m = t.mask.float()
    log_ratio = t.logprobs - t.old_logprobs
    seq = _seq_mean(log_ratio, m).detach()  # [B, 1]
    log_s = (t.logprobs - t.logprobs.detach() + seq).clamp(max=GSPO_MAX_LOG_RATIO)  # [B, T]
    s = torch.exp(log_s)
    adv = t.advantages
    loss = torch.maximum(-adv * s, -adv * s.clamp(1 - p.eps_low, 1 + p.eps_high))
    return loss, _gspo_metrics(log_ratio, torch.exp(seq.clamp(max=GSPO_MAX_LOG_RATIO)), adv, m, p)


@policy_loss("cispo", reads=("eps_low", "eps_high"))
def cispo(t: LossTensors, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, 2025): clip the importance weight, not the update, so every token keeps a
    gradient: loss_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * log pi_t. [B, T] -> [B, T].
    MiniMax use no lower bound in practice: set eps_low >= 1 for that."""
    log_ratio = t.logprobs - t.old_logprobs
    with torch.no_grad():
        r = safe_exp(log_ratio)
        w = r.clamp(min=max(0.0, 1 - p.eps_low), max=1 + p.eps_high)
        metrics = ratio_metrics(log_ratio, t.mask)
        metrics["is_clip_frac"] = masked_mean((w != r).float(), t.mask.float())
    return -w * t.advantages * t.logprobs, metrics


@policy_loss("truncated_is", reads=("eps_high",))
def truncated_is(t: LossTensors, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    """PipelineRL's REINFORCE with truncated importance sampling:
    loss_t = -sg(min(r_t, 1 + eps_high)) * A_t * log pi_t. [B, T] -> [B, T]."""
    log_ratio = t.logprobs - t.old_logprobs
    with torch.no_grad():
        r = safe_exp(log_ratio)
        w = r.clamp(max=1 + p.eps_high)
        metrics = ratio_metrics(log_ratio, t.mask)
        metrics["is_clip_frac"] = masked_mean((r > 1 + p.eps_high).float(), t.mask.float())
    return -w * t.advantages * t.logprobs, metrics


@policy_loss("reinforce", reads=())
def reinforce(t: LossTensors, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    """Plain REINFORCE (Williams 1992), on-policy: loss_t = -A_t * log pi_t. [B, T] -> [B, T]."""
    return -t.advantages * t.logprobs, ratio_metrics(t.logprobs - t.old_logprobs, t.mask)
