"""Outcome advantage estimators: rewards of each group -> one advantage per sample.

Every estimator here has the signature ``fn(rewards, valid=None, **kwargs) -> advantages`` with rewards of
shape [num_groups, G] (G = the largest group; shorter groups are right-padded) and advantages of the same
shape. ``valid`` [num_groups, G] (bool) marks the real samples: groups may differ in size after filtering,
and a padded slot is never read and gets advantage 0; None means every slot is a sample. All accept and
ignore unknown keyword arguments (the caller passes ``std_normalize=`` to every estimator). Token-level
estimators (GAE, token-level REINFORCE++) live in advantages_token.py. All functions are pure.
"""

from __future__ import annotations

from typing import Any

import torch

from streamrl.algo.registry import advantage


def _valid(rewards: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    return torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()


def _group_stats(
    rewards: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group: (sample count n, mean, unbiased std) over the valid slots, each [num_groups, 1].
    The std of a group of fewer than 2 samples is reported as 1 (such groups get A = 0 anyway).
    Groups of equal size take torch's row reductions, groups of unequal size each their own slice."""
    n = valid.sum(-1, keepdim=True).to(rewards.dtype)
    if rewards.shape[-1] < 2:
        return n, rewards.clone(), torch.ones_like(rewards)
    if bool(valid.all()):
        return n, rewards.mean(-1, keepdim=True), rewards.std(-1, keepdim=True)
    mean, std = torch.zeros_like(n), torch.ones_like(n)
    for i in range(rewards.shape[0]):
        x = rewards[i][valid[i]]
        if len(x):
            mean[i] = x.mean()
        if len(x) > 1:
            std[i] = x.std()
    return n, mean, std


def _finish(adv: torch.Tensor, valid: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Zero the padded slots and every group of fewer than two samples (nothing to compare with)."""
    return torch.where(valid & (n >= 2), adv, torch.zeros_like(adv))


@advantage("grpo", reads=("std_normalize",))
def grpo(
    rewards: torch.Tensor,
    valid: torch.Tensor | None = None,
    std_normalize: bool = True,
    eps: float = 1e-6,
    **_: Any,
) -> torch.Tensor:
    """GRPO (DeepSeekMath): A_i = (r_i - mean(r)) / (std(r) + eps) within each group.

    rewards, valid: [num_groups, G] -> [num_groups, G]. std is the unbiased (Bessel) estimate, as in verl
    and TRL; with std_normalize=False this is Dr.GRPO's advantage. A group of one sample gets A = 0.
    """
    ok = _valid(rewards, valid)
    n, mean, std = _group_stats(rewards, ok)
    centered = rewards - mean
    return _finish(centered / (std + eps) if std_normalize else centered, ok, n)


@advantage("dr_grpo")
def dr_grpo(rewards: torch.Tensor, valid: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean(r) per group.

    rewards, valid: [num_groups, G] -> [num_groups, G]. No division by the group std (which up-weights
    prompts that are nearly always right or wrong). ``std_normalize`` is ignored. A group of one sample
    gets A = 0.
    """
    ok = _valid(rewards, valid)
    n, mean, _ = _group_stats(rewards, ok)
    return _finish(rewards - mean, ok, n)


@advantage("rloo")
def rloo(rewards: torch.Tensor, valid: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, "Back to Basics"): leave-one-out baseline within each group.

    A_i = r_i - (sum_j r_j - r_i) / (n - 1) = n / (n - 1) * (r_i - mean(r)), n = the group's size.
    rewards, valid: [num_groups, G] -> [num_groups, G]. ``std_normalize`` is ignored. n = 1 gets A = 0
    (no other sample to form a baseline from).
    """
    ok = _valid(rewards, valid)
    v = ok.to(rewards.dtype)
    n = v.sum(-1, keepdim=True)
    loo_baseline = ((rewards * v).sum(-1, keepdim=True) - rewards) / (n - 1).clamp(min=1)
    return _finish(rewards - loo_baseline, ok, n)


def _batch_whiten(x: torch.Tensor, valid: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean(x)) / (std(x) + eps) over ALL valid elements of x (unbiased std); fewer than two
    valid elements give 0. Padded slots get 0."""
    n = int(valid.sum())
    if n < 2:
        return torch.zeros_like(x)
    vals = x[valid]
    out = (x - vals.mean()) / (vals.std() + eps)
    return torch.where(valid, out, torch.zeros_like(out))


@advantage("reinforce_pp", group_baseline=False)
def reinforce_pp(
    rewards: torch.Tensor, valid: torch.Tensor | None = None, eps: float = 1e-6, **_: Any
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262), outcome reward: normalise over the WHOLE batch.

    A = (r - mean_all(r)) / (std_all(r) + eps), with mean/std over all valid samples together (no
    per-prompt baseline), std the unbiased (Bessel, torch default) estimate and eps = 1e-6.
    rewards, valid: [num_groups, G] -> [num_groups, G]. ``std_normalize`` is ignored. A batch of one
    sample gets A = 0. Normalisation is per sample, not per token (verl/OpenRLHF whiten over response
    tokens: that is ``reinforce_pp_token``).
    """
    return _batch_whiten(rewards, _valid(rewards, valid), eps)


@advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(
    rewards: torch.Tensor, valid: torch.Tensor | None = None, eps: float = 1e-6, **_: Any
) -> torch.Tensor:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262): group-mean baseline, then batch normalisation.

    c = r - mean_group(r);  A = (c - mean_all(c)) / (std_all(c) + eps).
    mean_all(c) is 0 up to float error but is kept to follow the formula. std is the unbiased (Bessel,
    torch default) estimate over all valid samples; eps = 1e-6.
    rewards, valid: [num_groups, G] -> [num_groups, G]. ``std_normalize`` is ignored. A group of one
    sample has c = 0 (its own mean); a batch of one sample gets A = 0.
    """
    ok = _valid(rewards, valid)
    _, mean, _ = _group_stats(rewards, ok)
    return _batch_whiten(rewards - mean, ok, eps)


@advantage("remax", greedy_baseline=True)
def remax(
    rewards: torch.Tensor,
    valid: torch.Tensor | None = None,
    baseline_rewards: torch.Tensor | None = None,
    **_: Any,
) -> torch.Tensor:
    """ReMax (Li et al. 2023, arXiv:2310.10505): baseline = reward of the greedy response to the prompt.

    A_i = r_i - b, with b the reward of the greedy (temperature 0) decode of the same prompt.
    rewards, valid: [num_groups, G]; baseline_rewards: [num_groups] (one greedy reward per prompt)
    -> [num_groups, G]. ``std_normalize`` is ignored. Raises ValueError if baseline_rewards is missing.
    """
    if baseline_rewards is None:
        raise ValueError(
            "ReMax needs the greedy-decode reward of each prompt: pass baseline_rewards=[num_groups]"
        )
    if baseline_rewards.shape != rewards.shape[:1]:
        raise ValueError(
            f"ReMax baseline_rewards must have shape [num_groups]={list(rewards.shape[:1])}, "
            f"got {list(baseline_rewards.shape)}"
        )
    adv = rewards - baseline_rewards.to(rewards.dtype)[:, None]
    return torch.where(_valid(rewards, valid), adv, torch.zeros_like(adv))
