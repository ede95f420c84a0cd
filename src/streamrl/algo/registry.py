"""Name -> spec registries. Modules register their pure functions with the decorators; everything
outside algo/ asks a spec for what it needs (a value head, a greedy baseline, a proximal pass) instead
of comparing algorithm names. Look-ups go through streamrl.algo (which imports every module first)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class AdvantageSpec:
    """An advantage estimator. Outcome-level: fn(rewards [groups, G], **kw) -> [groups, G].

    token_level: per-token advantages from a value head (GAE): the trainer computes them, fn has its
        own signature and nothing per sample is logged.
    greedy_baseline: the rollout also decodes each prompt greedily and fn takes its reward
        (baseline_rewards [groups]) as the baseline (ReMax)."""

    name: str
    fn: Callable[..., Any]
    token_level: bool = False
    greedy_baseline: bool = False


@dataclass(frozen=True)
class LossSpec:
    """A policy loss: fn(LossInputs) -> (per-token loss [B, T], metrics).

    proximal: the loss reads the proximal policy's log-probs (decoupled PPO): with several optimizer
        steps per batch the trainer computes them in an extra pass before the first step."""

    name: str
    fn: Callable[..., Any]
    proximal: bool = False


ADVANTAGES: dict[str, AdvantageSpec] = {}
POLICY_LOSSES: dict[str, LossSpec] = {}
AGGREGATIONS: dict[str, Callable[..., Any]] = {}
KL_ESTIMATORS: dict[str, Callable[..., Any]] = {}


def _add(table: dict[str, Any], name: str, entry: Any) -> None:
    if name in table:
        raise ValueError(f"'{name}' is registered twice")
    table[name] = entry


def advantage(name: str, *, token_level: bool = False, greedy_baseline: bool = False) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        _add(ADVANTAGES, name, AdvantageSpec(name, fn, token_level, greedy_baseline))
        return fn

    return deco


def policy_loss(name: str, *, proximal: bool = False) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        _add(POLICY_LOSSES, name, LossSpec(name, fn, proximal))
        return fn

    return deco


def aggregation(name: str) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        _add(AGGREGATIONS, name, fn)
        return fn

    return deco


def kl_estimator(name: str) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        _add(KL_ESTIMATORS, name, fn)
        return fn

    return deco


def lookup(table: dict[str, Any], name: str, what: str) -> Any:
    if name not in table:
        raise KeyError(f"unknown {what} '{name}'; choose from {', '.join(sorted(table))}")
    return table[name]
