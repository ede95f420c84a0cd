"""Attention masks for models with sliding-window layers, built from token positions, not cache columns.

transformers builds a sliding layer's mask from cache columns: a query at column c sees the keys at
columns c - window + 1 .. c. The engine's KV cache has columns that hold no token of the row (left
padding, the padding between a cached prompt prefix and the rest, the holes rows leave when batches
join, a draft tree's nodes off the row's path), so counting columns would hide keys that are inside
the window. For a model with sliding layers the engine therefore builds the 4-D masks itself: a key is
visible when the row's padding mask, causality (or a draft tree's ancestry) allow it and its position
is within the window of the query's, q_pos - k_pos < window, as in a full forward of the sequence
alone (what the trainer computes). Models without sliding layers keep the 2-D mask transformers
expands itself.
"""

from __future__ import annotations

from typing import Any

import torch

SLIDING = "sliding_attention"


def sliding_window(config: Any) -> int | None:
    """The window of the model's sliding-window layers; None when no layer slides."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    if types is not None and SLIDING not in types:
        return None
    return int(window)


def column_positions(attn: torch.Tensor) -> torch.Tensor:
    """attn [C, W] (1: a token of the row) -> [C, W] each column's position: the row's tokens count
    from 0 in column order (padding columns repeat their left neighbour's, or 0; they are never seen)."""
    return (attn.long().cumsum(-1) - 1).clamp(min=0)


def causal_visible(attn: torch.Tensor, queries: int) -> torch.Tensor:
    """attn [C, W] -> [C, 1, Q, W] bool: the last Q columns as queries, each seeing the row's tokens at
    or before its own column."""
    width = attn.shape[1]
    causal = torch.ones(queries, width, dtype=torch.bool).tril(width - queries)
    return causal[None, None] & attn.bool()[:, None, None, :]


def forward_masks(config: Any, attn: torch.Tensor, positions: torch.Tensor) -> Any:
    """The `attention_mask` of a forward whose queries are the last Q columns of attn [C, W], at
    positions [C, Q] (a prefill after any cached prefix, or a decode step)."""
    visible = causal_visible(attn, positions.shape[1])
    return layer_masks(config, visible, positions, column_positions(attn))


def layer_masks(
    config: Any, visible: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> torch.Tensor | dict[str, torch.Tensor]:
    """visible [C, 1, Q, K] bool, q_pos [C, Q], k_pos [C, K] -> the `attention_mask` for the decoder:
    `visible` for a model without sliding layers; visible and within the window for one whose every
    layer slides; else {layer type: mask} (the form transformers' hybrid models take)."""
    window = sliding_window(config)
    if window is None:
        return visible
    near = (q_pos[:, None, :, None] - k_pos[:, None, None, :]) < window
    sliding = visible & near
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = set(getattr(config, "layer_types", None) or [SLIDING])
    if types == {SLIDING}:
        return sliding
    return {t: sliding if t == SLIDING else visible for t in types}


def on_device(mask: torch.Tensor | dict[str, torch.Tensor], device: Any) -> Any:
    """A mask from `layer_masks` on `device`."""
    if isinstance(mask, dict):
        return {k: v.to(device) for k, v in mask.items()}
    return mask.to(device)
