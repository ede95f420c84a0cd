"""The colocated placement: the engine lives in the trainer's process and takes the policy from it."""

from __future__ import annotations

from typing import Any


def push_policy(engine: Any, trainer: Any) -> None:
    """Bring an engine to the trainer's current policy: one with its own weights (another dtype) gets the
    merged policy state; one on the trainer's module gets trainer.engine_state() (None: shared as is;
    fsdp2: the gathered full weights for the engine's unsharded copy)."""
    if getattr(engine, "owns_weights", False):
        state = trainer.policy_state()
    else:
        state = trainer.engine_state() if hasattr(trainer, "engine_state") else None
    engine.update_weights(state, trainer.version)
