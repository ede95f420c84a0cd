"""Models that only run forward: the engine's own copy, the rollout worker's model, the KL reference."""

from __future__ import annotations

from typing import Any

import torch


def freeze(model: Any) -> Any:
    """eval mode, no gradients, and a densely strided LM-head input (contiguous_head_input); -> model."""
    model.eval().requires_grad_(False)
    contiguous_head_input(model)
    return model


def contiguous_head_input(model: Any) -> None:
    """Hand the LM head a contiguous input (the hook is added once per model).

    transformers runs the head on the last positions only (`logits_to_keep`): a [R, K, H] view whose
    rows are T x H apart. For such a view and a bf16 weight that does not require grad, torch's linear
    does not fold it into one matrix product: it broadcasts the [V, H] weight to a contiguous [R, H, V]
    copy for a batched product (R x 56 MB for SmolLM2: 7 GB for a 128-row prefill). A one-row view
    [1, 1, H] counts as contiguous (the strides of size-1 dimensions are ignored) and takes the same
    path, so the hook looks at the strides themselves (`dense`). A copy of the input costs R x K x H
    values."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "_streamrl_contiguous_input", False):
        return
    head.register_forward_pre_hook(_contiguous_input, with_kwargs=True)
    head._streamrl_contiguous_input = True


def _contiguous_input(
    _module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The forward pre-hook: the input tensor, positional or `input=`, with dense strides (`dense`)."""
    if args and isinstance(args[0], torch.Tensor):
        return (dense(args[0]), *args[1:]), kwargs
    if isinstance(kwargs.get("input"), torch.Tensor):
        return args, {**kwargs, "input": dense(kwargs["input"])}
    return args, kwargs


def dense(x: torch.Tensor) -> torch.Tensor:
    """x itself if its strides are those of a new tensor of its shape, else such a copy of it."""
    strides, step = [], 1
    for n in reversed(x.shape):
        strides.append(step)
        step *= n
    if x.stride() == tuple(reversed(strides)):
        return x
    return x.clone(memory_format=torch.contiguous_format)
