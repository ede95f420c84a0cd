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

    token_level: per-token advantages (algo/advantages_token.py): the trainer computes them from
        per-token rewards and masks, fn has its own signature and nothing per sample is logged.
    critic: the estimator reads a value head on the policy (GAE), trained with it.
    greedy_baseline: the rollout also decodes each prompt greedily and fn takes its reward
        (baseline_rewards [groups]) as the baseline (ReMax).
    reads: the advantage.* config keys fn reads (besides name); validation refuses a non-default
        value of any other one.
    group_baseline: a group whose rewards are all equal (its greedy baseline's too) gets zero advantage,
        which is what dynamic sampling's drop assumes; False for a batch baseline or a value head."""

    name: str
    fn: Callable[..., Any]
    token_level: bool = False
    greedy_baseline: bool = False
    critic: bool = False
    reads: frozenset[str] = frozenset()
    group_baseline: bool = True


@dataclass(frozen=True)
class LossSpec:
    """A policy loss: fn(LossTensors, LossParams) -> (per-token loss [B, T], metrics) (algo/loss_inputs.py).

    proximal: the loss reads the proximal policy's log-probs (decoupled PPO): with several optimizer
        steps per batch the trainer computes them in an extra pass before the first step.
    reads: the loss.* config keys the loss reads (LossParams fields, and `prox`); validation refuses a
        non-default value of a key no chosen piece reads, so nothing is ignored silently.
    behaviour_weight: the loss multiplies each token by pi_prox / pi_behav, its proximal policy (the
        trainer's, recomputed; proximal is then set) over the engine's sampling policy, so a behaviour
        policy that no trainer weights ever were (lenient speculative rollouts) is corrected; 1 with
        loss.prox=behav. False: the loss's ratio is taken against pi_behav itself (its old policy), or
        there is none, and validation refuses lenient rollouts unless a rollout correction weights by
        pi_old / pi_behav."""

    name: str
    fn: Callable[..., Any]
    proximal: bool = False
    reads: frozenset[str] = frozenset()
    behaviour_weight: bool = False


@dataclass(frozen=True)
class CorrectionSpec:
    """A rollout correction (algo/rollout_correction.py): fn(log_rho [B, T], mask [B, T], advantages
    [B, T], params) -> Correction; reads: the loss.rc_* keys it reads. rho is pi_old / pi_behav, the
    trainer's policy before the step over the engine's; with `current`, the policy being trained (this
    micro-batch's forward, detached) over the engine's, which moves within a step of several mini-batches."""

    name: str
    fn: Callable[..., Any]
    reads: frozenset[str] = frozenset()
    current: bool = False


ADVANTAGES: dict[str, AdvantageSpec] = {}
POLICY_LOSSES: dict[str, LossSpec] = {}
AGGREGATIONS: dict[str, Callable[..., Any]] = {}
KL_ESTIMATORS: dict[str, Callable[..., Any]] = {}
CORRECTIONS: dict[str, CorrectionSpec] = {}


def _add(table: dict[str, Any], name: str, entry: Any) -> None:
    if name in table:
        raise ValueError(f"'{name}' is registered twice")
    table[name] = entry


def advantage(
    name: str,
    *,
    token_level: bool = False,
    greedy_baseline: bool = False,
    critic: bool = False,
    reads: tuple[str, ...] = (),
    group_baseline: bool = True,
) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        spec = AdvantageSpec(name, fn, token_level, greedy_baseline, critic, frozenset(reads), group_baseline)
        _add(ADVANTAGES, name, spec)
        return fn

    return deco


def policy_loss(
    name: str, *, reads: tuple[str, ...], proximal: bool = False, behaviour_weight: bool = False
) -> Callable[[F], F]:
    if behaviour_weight and not proximal:
        raise ValueError(f"'{name}' weights by pi_prox / pi_behav: register it with proximal=True")

    def deco(fn: F) -> F:
        _add(POLICY_LOSSES, name, LossSpec(name, fn, proximal, frozenset(reads), behaviour_weight))
        return fn

    return deco


def rollout_correction(name: str, *, reads: tuple[str, ...] = (), current: bool = False) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        _add(CORRECTIONS, name, CorrectionSpec(name, fn, frozenset(reads), current))
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
