"""Rollout corrections: per-token factors for the gap between the engine's and the trainer's log-probs.

The engine samples with pi_behav (its own kernels and precision, maybe an older version); the trainer
recomputes pi_old, its log-probs with the weights before the step. rho_t = pi_old(y_t) / pi_behav(y_t)
per token. A correction turns log rho [B, T] into a detached weight [B, T] that multiplies the per-token
policy loss (0 drops a token); the loss's own ratio is then taken against pi_old (verl's "decoupled"
mode), so the engine/trainer factor is counted once. Each mode is
``fn(log_rho, mask, advantages, p: CorrectionParams) -> Correction``, all [B, T]. Exponentials are of log
rho clamped to [-20, 20]. Dropped tokens keep their place in the aggregation's normaliser.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from streamrl.algo.loss_inputs import MAX_LOG_RATIO
from streamrl.algo.registry import rollout_correction


@dataclass(frozen=True)
class CorrectionParams:
    """The loss.rc_* config keys: upper (rc_upper) and lower (rc_lower) bounds on a ratio, the geometric
    mask's tolerance (rc_geo_tol) and OPSM's threshold (rc_opsm_delta)."""

    upper: float = 2.0
    lower: float = 0.5
    geo_tol: float = 0.001
    opsm_delta: float = 1e-4


@dataclass(frozen=True)
class Correction:
    """weight: [B, T] detached factor on the per-token loss; dropped / truncated: [B, T] bool, the
    tokens it zeroes / whose weight it caps (for the metrics)."""

    weight: torch.Tensor
    dropped: torch.Tensor
    truncated: torch.Tensor


def _exp(log_rho: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_rho.clamp(min=-MAX_LOG_RATIO, max=MAX_LOG_RATIO))


def _seq(x: torch.Tensor, m: torch.Tensor, mean: bool) -> torch.Tensor:
    """Masked sum (or mean) of each row, broadcast back: [B, T] -> [B, T]."""
    total = (x * m).sum(-1, keepdim=True)
    if mean:
        total = total / m.sum(-1, keepdim=True).clamp(min=1)
    return total.expand_as(x)


def _none_of(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x, dtype=torch.bool)


@rollout_correction("none")
def none(log_rho: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, p: CorrectionParams) -> Correction:
    """No correction: weight 1 (the loss's ratio stays against pi_behav)."""
    return Correction(torch.ones_like(log_rho), _none_of(log_rho), _none_of(log_rho))


@rollout_correction("token_tis", reads=("rc_upper",))
def token_tis(
    log_rho: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, p: CorrectionParams
) -> Correction:
    """Token-level truncated IS (Yao et al. 2025): w_t = min(rho_t, upper)."""
    rho = _exp(log_rho)
    return Correction(rho.clamp(max=p.upper), _none_of(rho), rho > p.upper)


@rollout_correction("seq_tis", reads=("rc_upper",))
def seq_tis(log_rho: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, p: CorrectionParams) -> Correction:
    """Sequence-level truncated IS: rho_i = prod_t rho_t = exp(sum_t log rho_t); w = min(rho_i, upper)
    on every token of sequence i."""
    seq_rho = _exp(_seq(log_rho, mask.float(), mean=False))
    return Correction(seq_rho.clamp(max=p.upper), _none_of(seq_rho), seq_rho > p.upper)


@rollout_correction("token_mis", reads=("rc_upper",))
def token_mis(
    log_rho: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, p: CorrectionParams
) -> Correction:
    """Token-level masked IS (Liu et al. 2025): w_t = rho_t where rho_t <= upper, 0 above (the token is
    dropped rather than its weight capped)."""
    rho = _exp(log_rho)
    out = rho > p.upper
    return Correction(torch.where(out, torch.zeros_like(rho), rho), out, _none_of(rho))


@rollout_correction("seq_mis", reads=("rc_upper",))
def seq_mis(log_rho: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, p: CorrectionParams) -> Correction:
    """Sequence-level masked IS (Liu et al. 2025; verl's Seq-MIS): w = rho_i where rho_i <= upper, else
    the whole sequence is dropped (rho_i = exp(sum_t log rho_t))."""
    seq_rho = _exp(_seq(log_rho, mask.float(), mean=False))
    over = seq_rho > p.upper
    return Correction(torch.where(over, torch.zeros_like(seq_rho), seq_rho), over, _none_of(seq_rho))


@rollout_correction("geo_mask", reads=("rc_geo_tol",))
def geo_mask(log_rho: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, p: CorrectionParams) -> Correction:
    """Geometric-mean sequence mask (verl's Geo-RS): g_i = exp(mean_t log(pi_behav / pi_old)), the
    geometric mean of 1 / rho; the sequence is kept with weight 1 when 1 - geo_tol <= g_i <= 1 + geo_tol,
    dropped otherwise (no reweighting)."""
    g = _exp(_seq(-log_rho, mask.float(), mean=True))
    out = (g < 1 - p.geo_tol) | (g > 1 + p.geo_tol)
    return Correction((~out).float(), out, _none_of(g))


@rollout_correction("icepop", reads=("rc_lower", "rc_upper"))
def icepop(log_rho: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, p: CorrectionParams) -> Correction:
    """IcePop (Ring-1T, 2025): w_t = rho_t where lower <= rho_t <= upper, 0 outside (a two-sided
    token mask that keeps the IS weight inside the band)."""
    rho = _exp(log_rho)
    outside = (rho < p.lower) | (rho > p.upper)
    return Correction(torch.where(outside, torch.zeros_like(rho), rho), outside, _none_of(rho))


@rollout_correction("opsm", reads=("rc_opsm_delta",), current=True)
def opsm(log_rho: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, p: CorrectionParams) -> Correction:
    """Off-policy sequence masking (DeepSeek-V3.2, 2025): drop sequence i when its advantage (the mean
    of its token advantages) is negative AND mean_t log(pi_behav / pi_theta) > opsm_delta; weight 1
    otherwise. Negative samples the policy being trained already finds unlikely teach little and
    destabilise. rho here is pi_theta / pi_behav (`current`): the mask follows the policy as it moves
    through a step's mini-batches."""
    m = mask.float()
    off = (_seq(adv, m, mean=True) < 0) & (_seq(-log_rho, m, mean=True) > p.opsm_delta)
    return Correction((~off).float(), off, _none_of(log_rho))


def correction_counts(c: Correction, log_rho: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Raw counts of one micro-batch, summed over micro-batches (and ranks) by the trainer, then turned
    into step metrics by ``correction_metrics``: loss tokens and sequences, how many of each the
    correction dropped or truncated, the sum and the max of rho over the loss tokens."""
    with torch.no_grad():
        valid = mask > 0
        seqs = valid.any(-1)
        rho = _exp(log_rho.detach())[valid]
        counts = {
            "tokens": float(valid.sum()),
            "seqs": float(seqs.sum()),
            "tokens_dropped": float((c.dropped & valid).sum()),
            "seqs_dropped": float(((c.dropped & valid).any(-1) & seqs).sum()),
            "tokens_truncated": float((c.truncated & valid).sum()),
            "seqs_truncated": float(((c.truncated & valid).any(-1) & seqs).sum()),
            "ratio_sum": float(rho.sum()),
        }
        if rho.numel():  # a micro-batch without loss tokens has no max to merge
            counts["ratio_max"] = float(rho.max())
        return counts


def correction_metrics(counts: dict[str, float]) -> dict[str, float]:
    """Step metrics from the summed counts: rc_token_masked_frac / rc_seq_masked_frac (share of loss
    tokens / sequences with a dropped token), rc_token_truncated_frac / rc_seq_truncated_frac,
    rc_ratio_mean and rc_ratio_max of the engine/trainer ratio rho = pi_old / pi_behav."""
    tokens, seqs = max(counts["tokens"], 1.0), max(counts["seqs"], 1.0)
    return {
        "rc_token_masked_frac": counts["tokens_dropped"] / tokens,
        "rc_seq_masked_frac": counts["seqs_dropped"] / seqs,
        "rc_token_truncated_frac": counts["tokens_truncated"] / tokens,
        "rc_seq_truncated_frac": counts["seqs_truncated"] / seqs,
        "rc_ratio_mean": counts["ratio_sum"] / tokens,
        "rc_ratio_max": counts.get("ratio_max", 1.0),  # 1.0: no loss token in the step
    }
