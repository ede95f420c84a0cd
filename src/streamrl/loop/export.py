"""Exported checkpoints (RUN_DIR/checkpoint, RUN_DIR/checkpoints/step-N): the trained model in
checkpoint.dtype with its tokenizer, a model card (README.md) and, with LoRA, the PEFT adapter."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from streamrl.config import Config
from streamrl.files import TEMP
from streamrl.loop.durable import could_not_write, swap_in, temp_beside, write_failed
from streamrl.loop.state import STATE_DIR, latest_state
from streamrl.models import lora, smollm2
from streamrl.models.hub import split_id
from streamrl.models.precision import PRECISIONS
from streamrl.observe.model_card import Accuracy, model_card

HUB_IDS = {"smollm2-135m-instruct": smollm2.HUB_ID}
# models converted from a quantised GGUF: their weights are the dequantized ones, not those of the Hub
# model they were quantised from (HUB_IDS: the card's lineage) -> the directory of the converted model
DEQUANTIZED = {"smollm2-135m-instruct": smollm2.converted_dir}


def base_model_id(model: str) -> str | None:
    """The Hub id a run's `model` came from (the card's base_model, the adapter's base): the alias's,
    or `org/name` itself without its revision; None for a local directory or the test model."""
    if model in HUB_IDS:
        return HUB_IDS[model]
    if model == "tiny-random" or (Path(model).expanduser() / "config.json").is_file():
        return None
    parts = split_id(model)
    return parts[0] if parts is not None else None


def _name_the_adapters_base(checkpoint: Path, model: str) -> None:
    """The base the adapter applies to, in its adapter_config.json: a Hub model by its id (and the
    revision trained from, if one was given), not the snapshot directory it was trained from on this
    machine; a model dequantized from a GGUF by the converted directory training loaded, as the Hub model
    it was quantised from has other weights (the card names that one as its lineage)."""
    config = checkpoint / lora.ADAPTER_DIR / "adapter_config.json"
    if not config.is_file():
        return
    data = json.loads(config.read_text())
    if model in DEQUANTIZED:
        data["base_model_name_or_path"] = str(DEQUANTIZED[model]().expanduser().resolve())
    elif (base := base_model_id(model)) is not None:
        data["base_model_name_or_path"] = base
        parts = split_id(model)
        if parts is not None and parts[1]:
            data["revision"] = parts[1]
    else:
        return
    config.write_text(json.dumps(data, indent=2) + "\n")


class CheckpointWriteError(RuntimeError):
    """The checkpoint could not be written (a full disk, most often); the run state is kept."""


def export_stop(run_dir: Path, step: int, e: BaseException) -> str:
    """Why a run whose export of `step` (checkpoints/step-N) could not be written stops, and what to do.
    That step's state is not saved either: on a full disk its write would fail too, and the state a
    resume starts from, the one before, makes the resume train the step again and export it."""
    newest = latest_state(run_dir)
    fix = (
        f"free disk space and resume with resume={run_dir} (from its newest state, {newest.name})"
        if newest
        else "no state was saved yet: free disk space and train again with overwrite=true"
    )
    failed = could_not_write("the checkpoint", run_dir / "checkpoints" / f"step-{step}", e)
    return f"{failed} Step {step}'s state is not saved, so that a resume trains and exports it again: {fix}"


def prune_exports(root: Path, keep: int, step: int) -> list[Path]:
    """After the export of `step`: remove exports of later steps (a killed run's, past the state its
    resume restored), all but the newest `keep` of the rest (keep 0: none of them), and what writers
    killed mid-export left (.tmp-*); -> the exports removed, in step order."""
    if not root.is_dir():
        return []
    for leftover in root.glob(f"{TEMP}*"):
        if not leftover.name.endswith(f"-{os.getpid()}"):  # another process's: it is gone
            shutil.rmtree(leftover, ignore_errors=True)
    steps = sorted(
        (d for d in root.iterdir() if d.is_dir() and d.name.startswith("step-") and d.name[5:].isdigit()),
        key=lambda d: int(d.name[5:]),
    )
    stale = [d for d in steps if int(d.name[5:]) > step]
    steps = [d for d in steps if int(d.name[5:]) <= step]
    old = (steps[: max(0, len(steps) - keep)] if keep else []) + stale
    for d in old:
        shutil.rmtree(d, ignore_errors=True)
    return old


def export_checkpoint(
    trainer: Any,
    tokenizer: Any,
    path: Path,
    cfg: Config,
    steps: int,
    before: Accuracy | None,
    after: Accuracy | None,
) -> None:
    """Write the checkpoint directory `path` (see the module docstring); before/after: for the card.

    Written beside it first and renamed when complete, so an earlier checkpoint at `path` is only
    replaced by a whole one; a write that fails (a full disk) removes its partial directory and raises
    CheckpointWriteError naming where the newest run state keeps the model."""
    tmp: Path | None = None
    try:
        tmp = temp_beside(path)
        trainer.save(str(tmp), tokenizer, PRECISIONS[cfg.checkpoint.dtype])
        _name_the_adapters_base(tmp, cfg.model)
        card = model_card(cfg, steps, before, after, base_model_id(cfg.model))
        card.save(str(tmp / "README.md"))
        swap_in(tmp, path)
    except Exception as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not write_failed(e):
            raise
        state = Path(cfg.run_dir) / STATE_DIR
        kept = f" The run state in {state} holds the same model (model/ in its newest step)"
        raise CheckpointWriteError(f"{could_not_write('the checkpoint', path, e)}{kept}") from e
