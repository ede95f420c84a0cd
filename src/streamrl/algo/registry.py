"""Name -> function registries. Modules register with the decorators; config validation reads the keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

ADVANTAGES: dict[str, Callable[..., Any]] = {}
POLICY_LOSSES: dict[str, Callable[..., Any]] = {}
AGGREGATIONS: dict[str, Callable[..., Any]] = {}
KL_ESTIMATORS: dict[str, Callable[..., Any]] = {}


def _register(table: dict[str, Callable[..., Any]], name: str) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        if name in table:
            raise ValueError(f"'{name}' is registered twice")
        table[name] = fn
        return fn

    return deco


def advantage(name: str) -> Callable[[F], F]:
    return _register(ADVANTAGES, name)


def policy_loss(name: str) -> Callable[[F], F]:
    return _register(POLICY_LOSSES, name)


def aggregation(name: str) -> Callable[[F], F]:
    return _register(AGGREGATIONS, name)


def kl_estimator(name: str) -> Callable[[F], F]:
    return _register(KL_ESTIMATORS, name)


def get(table: dict[str, Callable[..., Any]], name: str, what: str) -> Callable[..., Any]:
    import streamrl.algo  # noqa: F401  (make sure every module has registered)

    if name not in table:
        raise KeyError(f"unknown {what} '{name}'; choose from {', '.join(sorted(table))}")
    return table[name]
