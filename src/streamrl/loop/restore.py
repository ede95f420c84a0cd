"""A stopped run's saved state loaded into fresh components: weights, optimizer, scheduler, random
states, the data stream's position and the policy version; the engine then takes the restored weights."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from streamrl.data.samplers import Sampler
from streamrl.loop.state import RunState, load_state, reconcile_carried
from streamrl.models.lora import is_lora
from streamrl.models.weight_files import SAFETENSORS, weight_set
from streamrl.placement.colocated import push_policy
from streamrl.trainer.full_state import with_implementation_of
from streamrl.trainer.trainer import Trainer


def restore(run_dir: Path, model: nn.Module, trainer: Trainer, engine: Any, stream: Sampler) -> RunState:
    """Load weights, optimizer and position of a stopped run into fresh components."""
    state, model_dir, tensors = load_state(run_dir)
    if (said := reconcile_carried(state)) is not None:  # a state an older version saved wrong
        print(f"streamrl: warning: {said}", file=sys.stderr, flush=True)
    if state.sampler:  # first: a stream that no longer reaches the saved position is refused at once
        stream.load_state_dict(state.sampler)  # positions, posteriors, levels: data/samplers.py
    else:  # a run saved before samplers: the uniform stream is deterministic, skip what was drawn
        Sampler.load_state_dict(stream, {"base_drawn": state.problems_drawn})
    weights = saved_weights(model_dir)
    # a state saved by another train.strategy keeps this optimizer's implementation (fused or not)
    optimizer = with_implementation_of(trainer.optimizer, tensors["optimizer"])
    if trainer.train.strategy == "fsdp2":  # sharded: every rank takes its shards of the saved state
        names = model.state_dict().keys()
        unexpected = [k for k in weights if k not in names]
    else:
        unexpected = model.load_state_dict(weights, strict=False).unexpected_keys  # LoRA: its adapter file
    if unexpected and not is_lora(model):
        raise ValueError(f"resume: {model_dir} does not match the model ({unexpected[:3]})")
    if trainer.train.strategy == "fsdp2":
        trainer.load_full_state(weights, optimizer)
    else:
        trainer.load_value_head(model_dir)
        trainer.load_adapter(model_dir)
        trainer.optimizer.load_state_dict(optimizer)
    trainer.scheduler.load_state_dict(tensors["scheduler"])
    torch.set_rng_state(tensors["torch_rng"])
    random.setstate(tensors["py_rng"])
    if "engine_rng" in tensors:
        engine.generator.set_state(tensors["engine_rng"])
    trainer.version = state.version
    if hasattr(trainer, "sync_followers"):  # data parallel: the follower ranks take the restored state
        trainer.sync_followers()
    push_policy(engine, trainer)
    return state


def saved_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a saved state's model directory: its model.safetensors, or every shard its
    model.safetensors.index.json names (save_pretrained shards a model past its max_shard_size)."""
    from safetensors.torch import load_file

    files = [f for f in weight_set(model_dir) if f.endswith(".safetensors")]  # what the save writes
    missing = [f for f in files if not (model_dir / f).is_file()]
    if not files and (model_dir / SAFETENSORS[1]).is_file():
        index = model_dir / SAFETENSORS[1]
        why = "cannot be read or names no safetensors shard"
        raise ValueError(f"resume: {index} {why}: its weights cannot be restored")
    if not files or missing:
        what = f"{missing[0]}, a shard its index names" if missing else "model.safetensors and a shard index"
        raise ValueError(f"resume: {model_dir} lacks {what}: its weights cannot be restored")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(model_dir / f)))
    return weights
