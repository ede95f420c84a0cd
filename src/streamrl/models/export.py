"""Saving a model directory with its weights in a chosen dtype, through transformers' save_pretrained."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from streamrl.models.quiet import no_progress_bars


def cast_state(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`state` with every floating tensor in `dtype` (the others, and those already in it, as they are).

    Tensors that share memory (tied embeddings) share their cast copy too: one copy, still tied."""
    out: dict[str, torch.Tensor] = {}
    cast: dict[tuple[Any, ...], torch.Tensor] = {}
    for key, value in state.items():
        if not value.is_floating_point() or value.dtype == dtype:
            out[key] = value
            continue
        where = (value.untyped_storage().data_ptr(), value.storage_offset(), value.shape, value.stride())
        if where not in cast:
            cast[where] = value.detach().to(dtype)
        out[key] = cast[where]
    return out


def save_model(model: Any, path: str | Path, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """`model`'s directory (config, generation config, safetensors) holding `state` cast to `dtype`.

    The live model is not touched: the cast copy of its weights (half their size in bf16) is saved in
    its place, and config.json names `dtype` (save_pretrained writes the dtype of the live weights)."""
    with no_progress_bars():
        model.save_pretrained(str(path), state_dict=cast_state(state, dtype))
    config = copy.deepcopy(model.config)
    config.dtype = dtype
    config.save_pretrained(str(path))
