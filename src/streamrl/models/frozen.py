"""Models that only run forward: the engine's own copy, the rollout worker's model, the KL reference."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

# an fp32 LM head on one CPU thread runs a product of 7 to 15 rows as one of 16 (padded_rows)
PAD_ROWS = (7, 16)


def freeze(model: Any) -> Any:
    """eval mode, no gradients, and the engine's LM head (engine_head); -> model."""
    model.eval().requires_grad_(False)
    engine_head(model)
    return model


def engine_head(model: Any) -> None:
    """The LM head as the engine runs it: a densely strided input (contiguous_head_input) and, on one
    CPU thread in fp32, a few rows padded to PAD_ROWS[1] (padded_rows)."""
    contiguous_head_input(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "_streamrl_padded_rows", False) or not isinstance(head, torch.nn.Linear):
        return
    head.forward = functools.partial(padded_rows, head.forward)
    head._streamrl_padded_rows = True


def padded_rows(forward: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
    """forward(x) (x positional or nn.Linear's `input=`), x's rows padded with zeros to PAD_ROWS[1] when
    it has PAD_ROWS[0] to PAD_ROWS[1] - 1 of them, the head is fp32 on a CPU running one thread, and no
    gradient is taken.

    MKL's single-threaded fp32 product of fewer than 16 rows by a large transposed weight streams the
    weight once per 3 rows: SmolLM2's [49152, 576] head costs 38-72 ms for 7-15 rows against 25-37 ms
    padded to 16 (`benchmarks/head_rows.py`), and a decode step of 7-15 cache rows runs the head once.
    On two threads the unpadded product is the faster but for 13-15 rows, so the padding is for one
    thread only. Each row's logits are its own whatever the others hold: the output is the unpadded
    one's up to rounding."""
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, torch.Tensor) or len(args) + len(kwargs) != 1:
        return forward(*args, **kwargs)
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    lo, hi = PAD_ROWS
    if (
        not lo <= rows < hi
        or x.device.type != "cpu"
        or x.dtype != torch.float32
        or torch.is_grad_enabled()
        or torch.get_num_threads() != 1
    ):
        return forward(*args, **kwargs)
    flat = x.new_zeros(hi, x.shape[-1])
    flat[:rows] = x.reshape(rows, x.shape[-1])
    out = forward(flat)
    return out[:rows].reshape(*x.shape[:-1], out.shape[-1])


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
