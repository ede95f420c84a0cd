"""Algorithm zoo: advantage estimators, policy losses, aggregations, KL estimators and rollout
corrections (pure functions), looked up by name through the functions below."""

from collections.abc import Callable
from typing import Any

from streamrl.algo import (  # noqa: F401  (registers by import)
    advantages,
    advantages_token,
    aggregation,
    kl,
    losses,
    losses_is,
    losses_m2po,
    rollout_correction,
)
from streamrl.algo.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    CORRECTIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageSpec,
    CorrectionSpec,
    LossSpec,
    lookup,
)


def advantage_spec(name: str) -> AdvantageSpec:
    return lookup(ADVANTAGES, name, "advantage estimator")


def loss_spec(name: str) -> LossSpec:
    return lookup(POLICY_LOSSES, name, "policy loss")


def correction_spec(name: str) -> CorrectionSpec:
    return lookup(CORRECTIONS, name, "rollout correction")


def aggregation_fn(name: str) -> Callable[..., Any]:
    return lookup(AGGREGATIONS, name, "aggregation")


def kl_fn(name: str) -> Callable[..., Any]:
    return lookup(KL_ESTIMATORS, name, "KL estimator")
