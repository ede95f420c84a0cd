"""KL estimators between the policy and a reference, per token: Schulman's k1, k2, k3, verl's abs, and
the straight-through k1+ / k3+ (the value of k1 / k3 with the gradient of k2). [B, T] -> [B, T]."""

from __future__ import annotations

import torch

from streamrl.algo.registry import kl_estimator


@kl_estimator("k1")
def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = log r with log r = log pi - log pi_ref. [B, T] -> [B, T]."""
    return logprobs - ref_logprobs


@kl_estimator("abs")
def abs_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """|log r| (verl's "abs"). [B, T] -> [B, T]."""
    return (logprobs - ref_logprobs).abs()


@kl_estimator("k2")
def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = (log r)^2 / 2. [B, T] -> [B, T]. Its gradient, log r * d log pi, is the one whose
    expectation under pi is the gradient of KL(pi || pi_ref)."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@kl_estimator("k3")
def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, clamp: float = 10.0) -> torch.Tensor:
    """k3 = exp(-log r) + log r - 1 >= 0, unbiased for KL(pi || pi_ref) under samples of pi (verl's
    low_var_kl).

    [B, T] -> [B, T]; log r is clamped to [-20, 20] first (an overflowing exp would turn the
    saturated clamp's zero gradient into NaN) and the result to [-clamp, clamp], as verl's low_var_kl.
    """
    log_r = (logprobs - ref_logprobs).clamp(min=-20.0, max=20.0)
    return (torch.exp(-log_r) + log_r - 1).clamp(min=-clamp, max=clamp)


def _straight_through(
    value: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor
) -> torch.Tensor:
    """value's value with k2's gradient: k2 - sg(k2) + sg(value)."""
    grad_part = k2(logprobs, ref_logprobs)
    return grad_part - grad_part.detach() + value.detach()


@kl_estimator("k1+")
def k1_plus(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Straight-through k1: the value of k1 (log r), the gradient of k2 (log r * d log pi). [B, T]."""
    return _straight_through(k1(logprobs, ref_logprobs), logprobs, ref_logprobs)


@kl_estimator("k3+")
def k3_plus(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Straight-through k3 (verl's k3+ / low_var_kl+): the value of k3 (clamps included), the
    gradient of k2. [B, T] -> [B, T]."""
    return _straight_through(k3(logprobs, ref_logprobs), logprobs, ref_logprobs)
