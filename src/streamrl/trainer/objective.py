"""The policy objective of one micro-batch: the loss inputs, the rollout correction, the per-token loss;
and the per-token rewards of the token-level advantage estimators."""

from __future__ import annotations

from typing import Any

import torch

from streamrl.algo.advantages_token import kl_shaped_rewards, terminal_rewards
from streamrl.algo.loss_inputs import LossParams, LossTensors
from streamrl.algo.registry import CorrectionSpec, LossSpec
from streamrl.algo.rollout_correction import CorrectionParams, correction_counts, correction_metrics
from streamrl.config import LossConfig

SUM, MAX = "_sum/", "_max/"  # trainer metric totals: summed raw counts / maxima (not token-weighted)
# a loss's extremes (ratio_max, ratio_min, behav_weight_max): the step's maximum / minimum over its
# micro-batches, reported under their own names (a token-weighted mean of extremes is neither)
HI, LO = "_hi/", "_lo/"


def loss_params(lc: LossConfig) -> LossParams:
    """The loss.* keys every policy loss may read, as one frozen object."""
    return LossParams(
        eps_low=lc.eps_low,
        eps_high=lc.eps_high,
        dual_clip=lc.dual_clip,
        behav_weight_cap=lc.behav_weight_cap,
        m2_threshold=lc.m2_threshold,
    )


def correction_params(lc: LossConfig) -> CorrectionParams:
    return CorrectionParams(
        upper=lc.rc_upper, lower=lc.rc_lower, geo_tol=lc.rc_geo_tol, opsm_delta=lc.rc_opsm_delta
    )


def policy_objective(
    spec: LossSpec,
    correction: CorrectionSpec,
    params: LossParams,
    cparams: CorrectionParams,
    *,
    logprobs: torch.Tensor,
    behav: torch.Tensor,
    trainer_old: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    prox_mode: str,
    m2_keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token policy loss [B, T] and metrics of one micro-batch (all tensors [B, T]).

    behav: the engine's log-probs; trainer_old: the trainer's before the step (None when not computed:
    no correction, no proximal pass, several optimizer steps per batch). Without a rollout correction the
    loss's ratio is against behav (decoupled PPO's proximal policy is trainer_old, or behav with
    prox_mode=behav). With one, every loss's ratio is against trainer_old and its per-token loss is
    multiplied by the correction's weight of rho = trainer_old / behav (logprobs / behav for a correction
    registered `current`, detached: OPSM). The correction's counts go into
    the metrics under SUM / MAX keys whenever trainer_old is known (ratio statistics even without one).
    m2_keep: M2PO's keep mask taken over the whole mini-batch (trainer/mini_batch_cuts.py).
    """
    corrected = correction.name != "none"
    old = ratio_base(correction, behav, trainer_old)
    prox = None
    if spec.proximal:
        prox = behav if (prox_mode == "behav" and not corrected) else trainer_old
    t = LossTensors(logprobs, old, advantages, mask, prox_logprobs=prox, m2_keep=m2_keep)
    per_token, metrics = spec.fn(t, params)
    metrics = {
        (HI if k.endswith("_max") else LO if k.endswith("_min") else "") + k: v for k, v in metrics.items()
    }
    if trainer_old is not None:
        log_rho = ((logprobs if correction.current else trainer_old) - behav).detach()
        c = correction.fn(log_rho, mask, advantages.detach(), cparams)
        if corrected:
            per_token = per_token * c.weight.detach()
        for k, v in correction_counts(c, log_rho, mask).items():
            metrics[(MAX if k == "ratio_max" else SUM) + k] = v
    return per_token, metrics


def ratio_base(
    correction: CorrectionSpec, behav: torch.Tensor, trainer_old: torch.Tensor | None
) -> torch.Tensor:
    """What the loss's ratio is taken against: the engine's log-probs, or with a rollout correction the
    trainer's before the step."""
    if correction.name == "none":
        return behav
    if trainer_old is None:
        raise ValueError("a rollout correction needs the trainer's log-probs before the step")
    return trainer_old


def accumulate(totals: dict[str, float], metrics: dict[str, float], n: float) -> None:
    """Add one micro-batch's metrics: token-weighted (v * n tokens), raw sums (SUM) or extremes (MAX,
    HI, LO; a micro-batch without loss tokens has none)."""
    for k, v in metrics.items():
        if not (n == 0 and k.startswith((HI, LO))):
            totals[k] = merge_metric(k, totals.get(k), v if k.startswith((SUM, MAX, HI, LO)) else v * n)


def merge_metric(key: str, total: float | None, value: float) -> float:
    """Two totals of one metric key, as micro-batches and ranks combine them."""
    if total is None:
        return value
    if key.startswith((MAX, HI)):
        return max(total, value)
    if key.startswith(LO):
        return min(total, value)
    return total + value


def finish(totals: dict[str, float], n_tokens: float) -> dict[str, float]:
    """Step metrics from the totals: token-weighted means, and the correction metrics from the counts."""
    out: dict[str, float] = {}
    counts: dict[str, float] = {}
    for k, v in totals.items():
        if k.startswith((SUM, MAX)):
            counts[k[len(SUM) :]] = v
        elif k.startswith((HI, LO)):
            out[k[len(HI) :]] = v
        else:
            out[k] = v / max(n_tokens, 1.0)
    if counts:
        out.update(correction_metrics(counts))
    return out


def token_rewards(
    mask: torch.Tensor, rewards: torch.Tensor, kl: torch.Tensor | None, kl_coef: float
) -> torch.Tensor:
    """Per-token rewards [B, T] of a token-level estimator: each row's reward [B] on its last loss token,
    minus kl_coef * kl [B, T] on every loss token when kl is given (loss.kl_in=token_reward)."""
    if kl is None:
        return terminal_rewards(mask, rewards)
    return kl_shaped_rewards(rewards, mask, kl, kl_coef)


def scatter_rows(groups: list[list[int]], tensors: list[torch.Tensor], n: int) -> torch.Tensor:
    """Micro-batch tensors [B_j, C_j] whose rows are trajectories groups[j] -> one [n, max C_j] tensor
    (zero padded on the right)."""
    width = max(x.shape[1] for x in tensors)
    out = torch.zeros(n, width, dtype=tensors[0].dtype)
    for g, x in zip(groups, tensors):
        out[g, : x.shape[1]] = x
    return out


def whole_batch_advantages(
    fn: Any,
    groups: list[list[int]],
    rewards: list[torch.Tensor],
    masks: list[torch.Tensor],
    n: int,
    gamma: float,
) -> list[torch.Tensor]:
    """A token-level estimator without a critic (token-level REINFORCE++) over the whole batch at once
    (its whitening spans every token of the batch): per micro-batch token rewards and masks in,
    per micro-batch advantages [B_j, C_j] out."""
    adv, _ = fn(scatter_rows(groups, rewards, n), scatter_rows(groups, masks, n), gamma=gamma)
    return [adv[g, : m.shape[1]] for g, m in zip(groups, masks)]
