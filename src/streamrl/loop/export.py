"""Exported checkpoints (RUN_DIR/checkpoint, RUN_DIR/checkpoints/step-N): the trained model in
checkpoint.dtype with its tokenizer, a model card (README.md) and, with LoRA, the PEFT adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamrl.config import Config
from streamrl.engine.hf import PRECISIONS
from streamrl.models import smollm2
from streamrl.observe.model_card import Accuracy, model_card

HUB_IDS = {"smollm2-135m-instruct": smollm2.HUB_ID}


def export_checkpoint(
    trainer: Any,
    tokenizer: Any,
    path: Path,
    cfg: Config,
    steps: int,
    before: Accuracy | None,
    after: Accuracy | None,
) -> None:
    """Write the checkpoint directory `path` (see the module docstring); before/after: for the card."""
    trainer.save(str(path), tokenizer, PRECISIONS[cfg.checkpoint.dtype])
    card = model_card(cfg, steps, before, after, HUB_IDS.get(cfg.model))
    card.save(str(path / "README.md"))
