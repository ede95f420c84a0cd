"""Algorithm zoo: advantage estimators, policy losses, aggregations, KL estimators (pure functions),
looked up by name through the functions below."""

from collections.abc import Callable
from typing import Any

from streamrl.algo import advantages, aggregation, kl, losses, losses_is  # noqa: F401  (registers by import)
from streamrl.algo.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageSpec,
    LossSpec,
    lookup,
)


def advantage_spec(name: str) -> AdvantageSpec:
    return lookup(ADVANTAGES, name, "advantage estimator")


def loss_spec(name: str) -> LossSpec:
    return lookup(POLICY_LOSSES, name, "policy loss")


def aggregation_fn(name: str) -> Callable[..., Any]:
    return lookup(AGGREGATIONS, name, "aggregation")


def kl_fn(name: str) -> Callable[..., Any]:
    return lookup(KL_ESTIMATORS, name, "KL estimator")
